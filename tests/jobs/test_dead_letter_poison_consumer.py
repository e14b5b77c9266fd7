"""A poison consumer: dead-lettered after N attempts with its error, the other
consumers unaffected; after the fix, a requeue delivers the event."""

from __future__ import annotations

import os
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from django.db import transaction

from jobs.consumers import Consumer, Event
from jobs.models import DeadLetter, OutboxEvent, ProcessedEvent, WorkspaceDailyCost
from jobs.services import dead_letter_requeue
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.conftest import wait_for
from tests.factories import TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def poison(event: Event) -> None:
    """Fails while the file named by POISON_FLAG exists (the bug), works once it is gone."""
    if Path(os.environ["POISON_FLAG"]).exists():
        raise RuntimeError(f"cannot digest {event.type}")
    return None


POISON = Consumer(name="poison", types=("agent.model.turn.completed",), handle=poison)
CONSUMERS = (
    "runs.cost_aggregation.COST_AGGREGATION,tests.jobs.test_dead_letter_poison_consumer.POISON"
)


def test_poison_consumer_is_dead_lettered_and_requeued_after_the_fix(
    settings,
    workspace,
    start_worker,
    monkeypatch,
    tmp_path,
):
    flag = tmp_path / "poisoned"
    flag.touch()
    stream = f"test_h4.poison.{uuid.uuid4().hex}"
    monkeypatch.setenv("POISON_FLAG", str(flag))
    monkeypatch.setenv("EVENT_CONSUMERS", CONSUMERS)
    settings.EVENT_CONSUMERS = CONSUMERS.split(",")
    monkeypatch.setenv("EVENT_CONSUMER_MAX_RETRIES", "2")
    monkeypatch.setenv("EVENT_CONSUMER_RETRY_BASE_SECONDS", "0.2")
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    start_worker("poison", queues="events", concurrency=2)
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(
            task=task,
            run=run,
            events=[
                PendingEvent(
                    "agent.model.turn.completed",
                    {"turn_no": 1, "tokens_in": 3, "tokens_out": 2, "cost_usd": "0.75"},
                )
            ],
        )
    event_id = str(OutboxEvent.objects.get(type="agent.model.turn.completed").event_id)

    letter = wait_for(
        lambda: DeadLetter.objects.filter(
            task_name="event.consume", kwargs={"consumer": "poison", "event_id": event_id}
        ).first(),
        timeout=40,
        message="dead letter",
    )

    assert letter.status == DeadLetter.Status.OPEN
    assert letter.attempts == 3  # the first try and two retries
    assert letter.recoveries == 0
    assert "RuntimeError: cannot digest agent.model.turn.completed" in letter.exception
    assert "Traceback" in letter.traceback
    assert letter.first_failed_at <= letter.last_failed_at
    assert letter.workspace_id == workspace.pk
    assert OutboxEvent.objects.filter(
        type="agent.job.dead_lettered", payload__data__dead_letter_id=str(letter.id)
    ).exists()
    # The other consumer did its work.
    cost = wait_for(
        lambda: WorkspaceDailyCost.objects.filter(workspace_id=workspace.pk).first(),
        timeout=20,
        message="cost aggregated",
    )
    assert cost.cost_usd == Decimal("0.75")
    assert not ProcessedEvent.objects.filter(consumer="poison").exists()

    flag.unlink()  # the fix
    assert dead_letter_requeue(letter=letter, by="operator")

    wait_for(
        lambda: ProcessedEvent.objects.filter(consumer="poison", event_id=event_id).exists(),
        timeout=30,
        message="requeued delivery",
    )
    letter.refresh_from_db()
    assert (letter.status, letter.resolved_by) == (DeadLetter.Status.REQUEUED, "operator")
    assert not dead_letter_requeue(letter=letter, by="operator")  # only once
    assert WorkspaceDailyCost.objects.get(workspace_id=workspace.pk).model_turns == 1
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)
