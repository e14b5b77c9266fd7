"""Consumer replay: recorded events re-delivered to one consumer, each applied once."""

from __future__ import annotations

import uuid

import pytest

from jobs.consumers import Consumer
from jobs.models import OutboxEvent, ProcessedEvent
from jobs.redelivery import outbox_envelopes, redeliver, redelivery_count
from runs.replay.redeliver import timeline_envelopes
from runs.timeline import event_record

pytestmark = pytest.mark.django_db(transaction=True)

APPLIED: list[str] = []


def _handle(event):
    return lambda: APPLIED.append(event.id)


COUNTER = Consumer(name="test-counter", types=("agent.*",), handle=_handle)


@pytest.fixture(autouse=True)
def counter_registered(settings):
    APPLIED.clear()
    settings.EVENT_CONSUMERS = [*settings.EVENT_CONSUMERS, f"{__name__}.COUNTER"]


def test_replay_of_1000_events_applies_the_unseen_half_exactly_once(run):
    ids = [uuid.uuid4() for _ in range(1000)]
    OutboxEvent.objects.bulk_create(
        OutboxEvent(
            event_id=event_id,
            type="agent.tool.call.completed",
            partition_key=str(run.id),
            payload={
                "specversion": "1.0",
                "id": str(event_id),
                "type": "agent.tool.call.completed",
            },
        )
        for event_id in ids
    )
    ProcessedEvent.objects.bulk_create(
        ProcessedEvent(consumer="test-counter", event_id=event_id) for event_id in ids[::2]
    )

    dry = redelivery_count(
        target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id))
    )
    assert (dry.events, dry.already_processed, dry.to_deliver) == (1000, 500, 500)
    assert APPLIED == []

    report = redeliver(target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id)))
    again = redeliver(target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id)))

    assert report.delivered == 500 and again.delivered == 0 and not report.failed
    assert [str(e) for e in ids[1::2]] == APPLIED  # the unseen half, in order, once each
    assert ProcessedEvent.objects.filter(consumer="test-counter").count() == 1000


def test_a_new_consumer_is_backfilled_from_the_timeline_after_the_outbox_is_pruned(run):
    from django.db import transaction

    with transaction.atomic():
        recorded = [
            event_record(
                task=run.task,
                run=run,
                type="agent.run.operator_action",
                data={"action": "x", "by": "t"},
            )
            for _ in range(3)
        ]
    OutboxEvent.objects.all().delete()

    report = redeliver(target="test-counter", envelopes=timeline_envelopes(run_id=run.id))

    assert report.delivered == 3
    assert [str(e.id) for e in recorded] == APPLIED
