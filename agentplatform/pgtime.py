"""PostgreSQL timestamps read by psycopg's C parser.

Django reads every ``timestamptz`` through a Python subclass of psycopg's pure-Python
loader (to pin the result's time zone), which costs about 4 µs a value: a page of runs
or a step's lease rows spend more time parsing times than PostgreSQL spends finding
them. Django sets each connection's session time zone to its own (UTC here), and the C
loader then returns the same values, ``datetime.timezone.utc`` included, about ten
times faster. It is registered on each new connection whose Django time zone is UTC;
otherwise Django's loader stays.
"""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
from django.db.backends.signals import connection_created
from psycopg.postgres import types as pg_types
from psycopg.pq import Format

TIMESTAMPTZ_OID = pg_types["timestamptz"].oid
_loader = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
# None with psycopg's pure-Python implementation (no C loader to use).
C_LOADER: Any = _loader if psycopg.pq.__impl__ in ("c", "binary") else None


class UtcTimestamptzLoader:
    """Makes psycopg's C ``timestamptz`` loader (a C type, which cannot be subclassed).

    ``timezone`` is what Django compares before each cursor to decide whether to
    register its own loader again; ``format`` is what psycopg's registry reads.
    """

    timezone = datetime.UTC
    format = Format.TEXT

    def __new__(cls, oid: int, context: Any = None) -> Any:
        return C_LOADER(oid, context)


def c_timestamps_use(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: a connection in UTC reads times in C."""
    if C_LOADER is None:
        return
    if connection.timezone is not datetime.UTC:
        return
    adapters = connection.connection.adapters
    # A pooled connection is handed out again and again; register once per connection.
    if adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not UtcTimestamptzLoader:
        adapters.register_loader(TIMESTAMPTZ_OID, UtcTimestamptzLoader)


def register() -> None:
    connection_created.connect(c_timestamps_use, dispatch_uid="agentplatform.pgtime")
