"""A worker's kept connection that died while idle is replaced by the step's first
statement, without the per-task health check and without failing or delaying the run."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from agentplatform.celery import _database_connections_tidy
from runs.engine import step_execute
from runs.lease import lease_acquire_loaded
from runs.models import Run
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _terminate(pid: int) -> None:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def _task(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, request=SimpleNamespace(is_eager=False))


def test_a_step_task_skips_the_health_check_and_other_tasks_keep_it(workspace):
    _backend_pid()
    _database_connections_tidy(sender=_task("runs.step"))
    assert connection.health_check_done
    _database_connections_tidy(sender=_task("jobs.work"))
    assert not connection.health_check_done


def test_the_lease_statement_replaces_a_connection_that_died_idle(workspace):
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    before = _backend_pid()
    _terminate(before)
    # As a worker starts a step: the dead connection is trusted, no health check.
    _database_connections_tidy(sender=_task("runs.step"))
    assert connection.connection is not None and connection.health_check_done

    acquired = lease_acquire_loaded(run_id=str(run.id), step_no=0, owner="w")

    assert acquired is not None
    lease, loaded = acquired
    assert (loaded.lease_owner, lease.attempt) == ("w", 1)
    assert _backend_pid() != before


def test_a_whole_step_rides_over_a_connection_that_died_idle(workspace):
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    _terminate(_backend_pid())
    _database_connections_tidy(sender=_task("runs.step"))

    assert step_execute(run_id=str(run.id), step_no=0) == Run.Status.PREPARING
    run.refresh_from_db()
    assert (run.status, run.step_no, run.lease_owner) == (Run.Status.PREPARING, 1, "")
