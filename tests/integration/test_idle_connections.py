"""An idle worker and beat open no new PostgreSQL connections once they are warm.

A worker's heartbeat thread used to close its connection after every beat, so an idle
worker opened a new PostgreSQL connection every ``WORKER_HEARTBEAT_SECONDS`` (6 per
minute with the default). Here a real worker (heartbeat every 0.3 s) and a real beat
(every safety-net sweep due every second, run by the worker) sit idle; the database's
own count of sessions opened must not move.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from jobs.models import WorkerHeartbeat
from jobs.schedules import beat_schedules_ensure
from runs.management.process_groups import process_groups_stop
from tests.conftest import beat_start, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WINDOW_SECONDS = 8.0


def _sessions_opened() -> int:
    """Connections ever opened to the test database (PostgreSQL's own counter)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


@pytest.fixture
def beat(tmp_path: Path) -> Any:
    log = open(tmp_path / "beat.log", "ab")  # noqa: SIM115 - closed below
    process = beat_start(tmp_path / "beat-schedule", log)
    yield tmp_path / "beat.log"
    process_groups_stop([process], timeout=15)
    log.close()


def test_idle_worker_and_beat_open_no_new_connections(start_worker: Any, beat: Path):
    beat_schedules_ensure(reset=True)
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.update(interval=every_second)
    start_worker("idle", concurrency=1, env={"WORKER_HEARTBEAT_SECONDS": "0.3"})
    wait_for(WorkerHeartbeat.objects.exists, timeout=30, message="the worker's heartbeat")

    def fired() -> int:
        return beat.read_bytes().count(b"Sending due task")

    # Warm: the beat has fired every sweep a few times and the pool process ran them.
    wait_for(lambda: fired() >= 12, timeout=60, interval=0.2, message="the sweeps to fire")
    time.sleep(2)
    before, fired_before = _sessions_opened(), fired()
    time.sleep(WINDOW_SECONDS)
    time.sleep(1.5)  # backends report their counters within a second
    opened = _sessions_opened() - before
    assert fired() > fired_before + WINDOW_SECONDS, "the beat was not firing meanwhile"
    assert opened <= 1, f"{opened} new connections in {WINDOW_SECONDS:.0f} s of idle"
