"""A brief shortage of PostgreSQL connections never fails a run.

The worker logs in as a role of its own with a ``CONNECTION LIMIT``. While a run is under
way the test takes every connection the role may have (after ending the worker's own),
so each reconnect of the worker is refused with "too many connections for role" for
longer than a lease; then it gives them back. Steps that met the shortage are retried
without needing the database to record the retry; a step whose heartbeat could not renew
its lease meanwhile gives the run up, and the reaper recovers it once the lease has run
out, as beat runs it (here the test calls it while it waits). The run must complete and
nothing may be dead-lettered.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs.models import DeadLetter
from runs import demo
from runs.models import Run
from runs.reaper import zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.services]

LIMIT = 8


def _admin() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    )


@pytest.fixture
def limited_role() -> Any:
    """A login role allowed ``LIMIT`` connections, with the rights the worker needs."""
    name = f"{settings.DATABASES['default']['NAME']}_scarce"[:60]
    with _admin() as admin:
        with contextlib.suppress(psycopg.Error):
            admin.execute(f'DROP OWNED BY "{name}"')
        admin.execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {LIMIT}')
        admin.execute(f'GRANT ALL ON SCHEMA public TO "{name}"')
        admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{name}"')
        admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{name}"')
    yield name
    with _admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name]
        )
        admin.execute(f'DROP OWNED BY "{name}"')
        admin.execute(f'DROP ROLE "{name}"')


def _take_every_connection(role: str) -> list[psycopg.Connection]:
    """End the role's connections and hold all it may open; returns what is held."""
    db = settings.DATABASES["default"]
    held: list[psycopg.Connection] = []
    with _admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
    deadline = time.monotonic() + 10
    while len(held) < LIMIT and time.monotonic() < deadline:
        try:
            held.append(
                psycopg.connect(
                    dbname=db["NAME"], user=role, host=db["HOST"], port=db["PORT"], autocommit=True
                )
            )
        except psycopg.OperationalError:
            # The worker reconnected in between: take its slot away again.
            with _admin() as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = %s AND NOT pid = ANY(%s)",
                    [role, [c.info.backend_pid for c in held]],
                )
    assert len(held) == LIMIT, f"held {len(held)} of {LIMIT} connections"
    return held


def test_a_run_rides_out_a_connection_shortage(workspace, repository, start_worker, limited_role):
    db = settings.DATABASES["default"]
    worker = start_worker(
        env={
            "DATABASE_URL": (f"postgres://{limited_role}@{db['HOST']}:{db['PORT']}/{db['NAME']}"),
        }
    )
    run = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    ).run
    wait_for(lambda: Run.objects.get(pk=run.pk).step_no >= 1, timeout=60, message="run started")
    for _ in range(3):
        held = _take_every_connection(limited_role)
        time.sleep(settings.RUN_LEASE_SECONDS + 1.5)  # longer than a lease
        for conn in held:
            conn.close()
        time.sleep(1.0)

    def ended() -> Run | None:
        zombies_reap()
        current = Run.objects.get(pk=run.pk)
        return current if current.status in TERMINAL else None

    final = wait_for(ended, timeout=180, message="run to end")
    assert final.status == Run.Status.COMPLETED, (final.failure_reason, final.failure_detail)
    # The shortage was real: the worker was refused for the role's limit.
    assert "too many connections for role" in worker.output()
    connection.close()
    assert list(DeadLetter.objects.values_list("task_name", "exception")) == []
