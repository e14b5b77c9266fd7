"""A relay killed after publishing but before marking: the events go out again and
the consumers absorb the duplicates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction

from jobs.models import OutboxEvent, ProcessedEvent, WorkspaceDailyCost
from jobs.relay import RELAY_QUEUE, outbox_drain
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.conftest import ROOT, wait_for
from tests.factories import TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Holds the relay inside its "mark published" UPDATE, after it has published: the
# window a crash must not turn into a lost event.
STALL_MARKING = """
CREATE OR REPLACE FUNCTION test_stall_marking() RETURNS trigger AS $$
BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_stall_marking BEFORE UPDATE ON jobs_outboxevent FOR EACH ROW
WHEN (OLD.published_at IS NULL AND NEW.published_at IS NOT NULL)
EXECUTE FUNCTION test_stall_marking();
"""
UNSTALL = """
DROP TRIGGER IF EXISTS test_stall_marking ON jobs_outboxevent;
DROP FUNCTION IF EXISTS test_stall_marking();
"""


def _relay_process(stream: str) -> subprocess.Popen:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "EVENT_STREAM_NAME": stream,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "outbox_relay"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_relay_killed_before_marking_publishes_again_and_consumers_dedupe(
    workspace,
    start_worker,
    monkeypatch,
):
    stream = f"test_h4.crash.{uuid.uuid4().hex}"
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    client = redis.Redis.from_url(settings.REDIS_URL)
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    with connection.cursor() as cursor:
        cursor.execute(STALL_MARKING)
    try:
        with transaction.atomic():
            events_record(
                task=task,
                run=run,
                events=[
                    PendingEvent(
                        "agent.model.turn.completed",
                        {"turn_no": i, "tokens_in": 1, "tokens_out": 1, "cost_usd": "0.5"},
                    )
                    for i in range(1, 4)
                ],
            )
        client.delete(RELAY_QUEUE)  # the on-commit wake-up: this test relays by hand

        relay = _relay_process(stream)
        wait_for(lambda: client.xlen(stream) == 3, timeout=30, message="first publish")
        time.sleep(0.3)
        os.killpg(relay.pid, signal.SIGKILL)
        relay.wait()
        with connection.cursor() as cursor:
            # The dead relay's session would hold its row locks until the sleep ends.
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(UNSTALL)

    assert OutboxEvent.objects.filter(published_at__isnull=True).count() == 3
    with monkeypatch.context() as patch:
        patch.setattr(settings, "EVENT_STREAM_NAME", stream)
        assert outbox_drain().published == 3
    assert client.xlen(stream) == 6  # every event twice on the stream

    start_worker("crash", queues="events", concurrency=2)
    event_ids = list(OutboxEvent.objects.values_list("event_id", flat=True))
    wait_for(
        lambda: (
            ProcessedEvent.objects.filter(
                consumer="cost_aggregation", event_id__in=event_ids
            ).count()
            == 3
        ),
        timeout=30,
        message="receipts",
    )
    wait_for(lambda: client.llen("events") == 0, timeout=30, message="duplicates consumed")
    time.sleep(0.5)
    cost = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert (cost.cost_usd, cost.model_turns) == (Decimal("1.5"), 3)
    client.delete(stream)
