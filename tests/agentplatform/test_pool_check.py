"""The connection pool (Django's own, ``DATABASE_POOL``) replaces a connection the
server ended (a restart, ``pg_terminate_backend``) before a request uses it.

The pool here is the one the web settings build, through Django's backend as the web
process uses it; the server ends the connection for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.utils import ConnectionHandler

from tests.conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pooled() -> Iterator[Any]:
    """A connection handler for the test database with the web settings' pool."""
    settings_dict = dict(connection.settings_dict)
    settings_dict.update(
        ENGINE="django.db.backends.postgresql",
        CONN_MAX_AGE=0,
        CONN_HEALTH_CHECKS=True,
        OPTIONS={**settings_dict.get("OPTIONS", {}), "pool": {"min_size": 1, "max_size": 1}},
    )
    handler = ConnectionHandler({"default": settings_dict})
    wrapper = handler["default"]
    try:
        yield wrapper
    finally:
        wrapper.close()
        wrapper.close_pool()


def _backend_pid(wrapper: Any) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_connection_the_server_ended_is_replaced_before_use(pooled: Any) -> None:
    pid = _backend_pid(pooled)
    pooled.close()  # back to the pool, idle
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone()[0] is True

    def backend_gone() -> bool:
        # pg_terminate_backend only signals: the backend ends (and closes its side of
        # the socket) a moment later. A request that comes meanwhile meets the
        # connection as it would between two checks.
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0] == 0

    wait_for(backend_gone, timeout=10, message="the backend ended")
    # The next request's first statement works, on a new connection.
    new_pid = _backend_pid(pooled)
    assert new_pid != pid
