"""A worker's heartbeat is one statement, also when it revives a stopped row."""

from __future__ import annotations

import pytest

from jobs.models import WorkerHeartbeat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]


def test_a_heartbeat_is_one_statement_that_revives_a_stopped_row() -> None:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from jobs.workers import worker_heartbeat_record, worker_stopped_record

    started = timezone.now() - timedelta(minutes=5)
    beat = {"name": "w@h", "hostname": "h", "pid": 1, "queues": ["verify", "agent"]}
    worker_heartbeat_record(**beat, concurrency=2, started_at=started)
    worker_stopped_record(name="w@h")

    with CaptureQueriesContext(connection) as queries:
        worker_heartbeat_record(**{**beat, "pid": 2}, concurrency=4, started_at=started)

    assert len(queries) == 1, [q["sql"] for q in queries]
    row = WorkerHeartbeat.objects.get(name="w@h")
    assert (row.pid, row.queues, row.concurrency) == (2, ["agent", "verify"], 4)
    assert row.stopped_at is None
    assert row.last_heartbeat_at > started
