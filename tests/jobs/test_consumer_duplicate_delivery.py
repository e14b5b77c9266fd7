"""The same event delivered twice (or more) has its side effect once."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import transaction

from jobs.consumers import event_consume
from jobs.models import OutboxEvent, ProcessedEvent, WorkItem, WorkspaceDailyCost
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.conftest import wait_for
from tests.factories import TaskFactory


def _turns(workspace, costs: list[str]) -> list[str]:
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(
            task=task,
            run=run,
            events=[
                PendingEvent(
                    "agent.model.turn.completed",
                    {"turn_no": i, "tokens_in": 100, "tokens_out": 10, "cost_usd": cost},
                )
                for i, cost in enumerate(costs, start=1)
            ],
        )
    return [
        str(e)
        for e in OutboxEvent.objects.filter(
            type="agent.model.turn.completed",
            payload__taskid=str(task.id),
        )
        .order_by("id")
        .values_list("event_id", flat=True)
    ]


@pytest.mark.django_db(transaction=True)
def test_duplicate_delivery_is_processed_once(workspace):
    (event_id,) = _turns(workspace, ["0.25"])

    assert event_consume(consumer="cost_aggregation", event_id=event_id) == "processed"
    assert event_consume(consumer="cost_aggregation", event_id=event_id) == "duplicate"

    cost = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert (cost.cost_usd, cost.model_turns, cost.tokens_in) == (Decimal("0.25"), 1, 100)
    assert ProcessedEvent.objects.filter(consumer="cost_aggregation").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_duplicate_messages_on_a_real_worker_change_state_once(
    workspace,
    start_worker,
    monkeypatch,
):
    monkeypatch.setenv("EVENT_STREAM_NAME", f"test_h4.dup.{uuid.uuid4().hex}")
    start_worker("dup", queues="events", concurrency=2)
    event_ids = _turns(workspace, ["0.10", "0.20", "0.30"])
    # The relay (woken on commit) delivers each event once; send each wake-up twice
    # more, as a broker redelivery or a replay would.
    from agentplatform.celery import app

    def covered() -> list[str]:
        return [
            e
            for args in WorkItem.objects.filter(kind="event.consume").values_list("args", flat=True)
            for e in args.get("event_ids") or [args["event_id"]]
        ]

    wait_for(lambda: sorted(covered()) == sorted(event_ids), timeout=30, message="work items")
    # One commit, one relay batch: one work item carries the consumer's three events.
    assert WorkItem.objects.filter(kind="event.consume").count() == 1
    for item in WorkItem.objects.filter(kind="event.consume"):
        for _ in range(2):
            app.send_task("jobs.work", args=[item.pk], queue="events")

    wait_for(
        lambda: (
            ProcessedEvent.objects.filter(
                consumer="cost_aggregation", event_id__in=event_ids
            ).count()
            == 3
        ),
        timeout=30,
        message="three receipts",
    )
    wait_for(
        lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(),
        timeout=30,
        message="outbox drained",
    )

    # Let the remaining duplicate messages run; they must change nothing.
    def queue_empty() -> bool:
        with app.connection_for_write() as conn:
            return conn.default_channel.client.llen("events") == 0

    wait_for(queue_empty, timeout=30, message="events queue drained")
    cost = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert cost.cost_usd == Decimal("0.60")
    assert cost.model_turns == 3
    assert cost.tokens_in == 300
