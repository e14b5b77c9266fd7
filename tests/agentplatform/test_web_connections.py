"""An idle ASGI web process holds the pool's minimum of PostgreSQL connections, no more.

Django runs each ASGI request's sync code in a fresh thread; with per-thread persistent
connections every request left a connection behind (17 on one idle process). The server
here is the real uvicorn process serving ``agentplatform.asgi``, hit by concurrent
requests, then left idle; its connections are counted in pg_stat_activity by the
application name it was given.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.conftest import web_server

ROOT = Path(__file__).resolve().parents[2]
POOL_MIN = 2

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def _connections(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )
        return int(cursor.fetchone()[0])


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310
        return int(answer.status)


@pytest.fixture
def web() -> Any:
    name = f"web-idle-{uuid.uuid4().hex[:8]}"
    with web_server(
        DATABASE_APPLICATION_NAME=name,
        DATABASE_POOL_MIN_SIZE=str(POOL_MIN),
        # Connections above the minimum close after a second idle (a minute by default).
        DATABASE_POOL_MAX_IDLE="1",
    ) as (url, _):
        yield url, name


def test_idle_web_process_holds_the_pools_minimum(web: Any) -> None:
    url, name = web
    # Sequential requests, then a concurrent burst: each ran in a thread of its own.
    for _ in range(10):
        assert _get(f"{url}/readyz") == 200
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert set(pool.map(lambda _: _get(f"{url}/readyz"), range(64))) == {200}
    busy = _connections(name)
    assert POOL_MIN <= busy <= int(os.environ.get("DATABASE_POOL_MAX_SIZE", "10"))
    deadline = time.monotonic() + 30
    while _connections(name) > POOL_MIN and time.monotonic() < deadline:
        time.sleep(0.5)
    idle = _connections(name)
    assert idle == POOL_MIN, f"{idle} connections held by an idle web process"
