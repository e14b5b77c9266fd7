"""The relay is not starved behind a full events queue: it has a queue of its own, served
by every worker of "events" without naming it."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.conf import settings
from django.db import transaction

from jobs.models import OutboxEvent
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.conftest import wait_for
from tests.factories import TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BACKLOG = 3000


def test_relay_publishes_while_thousands_of_consumer_messages_wait(
    workspace, start_worker, monkeypatch
):
    stream = f"test_relay_queue.{uuid.uuid4().hex}"
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    # The worker is deployed for "events" only, as delivery workers are.
    start_worker("delivery", queues="events", concurrency=1)
    from agentplatform.celery import app

    # A consumer backlog: wake-ups of work items that no longer exist (each is a read).
    with app.producer_or_acquire() as producer:
        for _ in range(BACKLOG):
            app.send_task("jobs.work", args=(10**12,), queue="events", producer=producer)
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.llen("events") > BACKLOG // 2

    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    started = time.monotonic()
    with transaction.atomic():
        events_record(
            task=task,
            run=run,
            events=[PendingEvent("agent.run.status.changed", {"from": "a", "to": "b"})],
        )
    wait_for(
        lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(),
        timeout=60,
        interval=0.02,
        message="event published",
    )
    waited = time.monotonic() - started
    left = broker.llen("events")
    assert left > BACKLOG // 4, f"published only after the backlog drained ({left} left)"
    assert waited < 10
    assert redis.Redis.from_url(settings.REDIS_URL).xlen(stream) == 1
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)
    broker.delete("events")
