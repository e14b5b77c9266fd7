"""The heartbeat survives a lost database connection, and knows when its lease ran out."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runs.heartbeat import Heartbeat
from runs.lease import lease_acquire
from runs.models import Run
from tests.conftest import wait_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _leased_run(workspace):
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    lease = lease_acquire(run_id=run.pk, step_no=run.step_no, owner="test-worker")
    assert lease is not None
    return run, lease


def _other_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return [pid for (pid,) in cursor.fetchall()]


def test_heartbeat_reconnects_after_its_backend_connection_is_terminated(workspace):
    run, lease = _leased_run(workspace)
    with Heartbeat(lease) as heartbeat:
        # The heartbeat thread has its own connection once it renewed.
        wait_for(_other_backends, timeout=10, message="the heartbeat's connection")
        with connection.cursor() as cursor:
            for pid in _other_backends():
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        terminated = timezone.now()

        def renewed_since() -> bool:
            run.refresh_from_db()
            return run.heartbeat_at is not None and run.heartbeat_at > terminated

        wait_for(renewed_since, timeout=settings.RUN_LEASE_SECONDS * 2, message="a renewal")
        assert not heartbeat.lost
        assert not heartbeat.should_stop()


def test_lease_is_declared_lost_once_it_passes_unrenewed(workspace):
    _, lease = _leased_run(workspace)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        name = cursor.fetchone()[0]
    with Heartbeat(lease) as heartbeat:
        wait_for(_other_backends, timeout=10, message="the heartbeat's connection")
        # The database restarts and does not let anyone back in for a while: the
        # heartbeat's connection dies and every reconnect is refused.
        db = settings.DATABASES["default"]
        with psycopg.connect(
            dbname="postgres", user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
        ) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            try:
                for pid in _other_backends():
                    admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                time.sleep(settings.RUN_LEASE_SECONDS + 0.5)
                assert heartbeat.lost
                assert heartbeat.should_stop()
            finally:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        # Renewals that get through later do not bring the lease back.
        time.sleep(settings.RUN_LEASE_SECONDS / 3 + 0.5)
        assert heartbeat.lost


def test_a_renewal_waiting_on_the_run_lock_is_not_a_lost_lease(workspace):
    """Whoever holds the run's row lock keeps the reaper out as well."""
    run, lease = _leased_run(workspace)
    with Heartbeat(lease) as heartbeat:
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=run.pk)
            time.sleep(settings.RUN_LEASE_SECONDS + 0.5)
            assert not heartbeat.lost
        wait_for(
            lambda: Run.objects.get(pk=run.pk).lease_until > timezone.now(),
            timeout=5,
            message="the renewal once the lock is gone",
        )
        assert not heartbeat.lost
