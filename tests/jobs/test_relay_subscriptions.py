"""The relay's HTTP subscription deliveries: read with the batch's claim, as the ORM reads
them (active, the events' workspaces, by id), and every change is seen by the next batch."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from jobs.models import EventSubscription, OutboxEvent, WorkItem
from jobs.relay import Deliveries, outbox_relay_batch
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _record(task, type: str) -> None:
    run = Run.objects.filter(task=task).first() or Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(task=task, run=run, events=[PendingEvent(type, {"run_no": 1})])


def _deliveries() -> set[tuple[int, str]]:
    return {
        (item.args["subscription_id"], item.args["event_id"])
        for item in WorkItem.objects.filter(kind="subscription.deliver")
    }


def _sub(workspace, **fields) -> EventSubscription:
    return EventSubscription.objects.create(
        workspace_id=workspace.pk, url="http://127.0.0.1:9/hook", secret="s", **fields
    )


@override_settings(EVENT_STREAM_REDIS_URL="")
def test_subscriptions_read_with_the_claim_match_the_orm_and_changes_apply_at_once():
    mine, other = WorkspaceFactory(), WorkspaceFactory()
    every = _sub(mine)
    runs_only = _sub(mine, event_types=["agent.run.*"])
    _sub(mine, active=False)
    _sub(other)
    task, elsewhere = TaskFactory(workspace=mine), TaskFactory(workspace=other)
    _record(task, "agent.task.completed")
    _record(task, "agent.run.started")
    _record(elsewhere, "agent.run.started")

    pending = list(OutboxEvent.objects.filter(published_at__isnull=True).order_by("id"))
    expected = Deliveries.for_rows(pending).work_for(pending)
    assert outbox_relay_batch().published == 3
    assert {key for key, _, _ in expected["subscription.deliver"]} == set(
        WorkItem.objects.filter(kind="subscription.deliver").values_list("key", flat=True)
    )
    started = ids_of(pending, mine, "agent.run.started")
    assert _deliveries() == {
        (every.pk, ids_of(pending, mine, "agent.task.completed")),
        (every.pk, started),
        (runs_only.pk, started),
        (
            EventSubscription.objects.get(workspace_id=other.pk).pk,
            ids_of(pending, other, "agent.run.started"),
        ),
    }

    # Changes made any way (here a queryset update, which no signal sees) count for the
    # very next batch: a subscription switched off gets nothing, a new one gets its events.
    WorkItem.objects.all().delete()
    EventSubscription.objects.filter(pk=every.pk).update(active=False)
    added = _sub(mine, event_types=["agent.task.*"])
    _record(task, "agent.task.failed")
    _record(task, "agent.run.finished")
    fresh = {
        row.type: str(row.event_id) for row in OutboxEvent.objects.filter(published_at__isnull=True)
    }
    assert outbox_relay_batch().published == 2
    assert _deliveries() == {
        (added.pk, fresh["agent.task.failed"]),
        (runs_only.pk, fresh["agent.run.finished"]),
    }


def ids_of(rows: list[OutboxEvent], workspace, type: str) -> str:
    (event_id,) = [
        str(row.event_id)
        for row in rows
        if row.type == type and row.payload["workspaceid"] == str(workspace.pk)
    ]
    return event_id
