"""Django's PostgreSQL backend, whose connection pool checks a connection it hands out
without a round trip.

psycopg_pool's own check (``ConnectionPool.check_connection``, which Django installs with
``CONN_HEALTH_CHECKS``) sends an empty query: a round trip on every request. An idle
connection has nothing to read, so its socket tells the same without one: a server that
ended the connection (a restart, a failover, ``pg_terminate_backend``, an idle timeout)
sent its error and closed, and the socket turned readable. Only then does the check ask
the server, and the pool replaces the connection that fails. A connection cut without a
word (a peer gone from the network) is found by the request's own statement instead, as
it would be between two checks.

The web entry point's settings (``DATABASE_POOL``) select this engine.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import ConnectionPool


def pool_connection_check(conn: Any) -> None:
    """Return quietly if ``conn`` is still good; raise if it is not (the pool drops it)."""
    pgconn = conn.pgconn
    idle = pgconn.status == ConnStatus.OK and pgconn.transaction_status == TransactionStatus.IDLE
    if not idle or _readable(pgconn.socket):
        ConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    # poll, not select: a busy server process may hold descriptors above select's 1024.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


# The stubs leave out the pool's parts of Django's wrapper (its pools, its configure).
_DjangoWrapper: Any = base.DatabaseWrapper


class DatabaseWrapper(_DjangoWrapper):  # type: ignore[misc]
    @property
    def pool(self) -> Any:
        options = self.settings_dict["OPTIONS"].get("pool")
        if (
            self.alias != base.NO_DB_ALIAS  # type: ignore[attr-defined]
            and options
            and self.alias not in self._connection_pools
            and self.settings_dict["CONN_HEALTH_CHECKS"]
        ):
            # Django's pool (options, connection parameters, configure), with the check
            # above in place of psycopg_pool's.
            kwargs = self.get_connection_params()
            kwargs["autocommit"] = True  # as Django's: it sets autocommit itself later
            pool = ConnectionPool(
                kwargs=kwargs,
                open=False,
                configure=self._configure_connection,
                check=pool_connection_check,
                **({} if options is True else options),
            )
            # As Django's: threads that race here build a pool each; the first one stays.
            self._connection_pools.setdefault(self.alias, pool)
        return super().pool
