"""Events delivered out of order (and repeated) still leave the right final state."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.db import transaction

from jobs.consumers import event_consume
from jobs.models import OutboxEvent, WorkspaceDailyCost
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory, WorkspaceFactory

START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.UTC)


def _turns(workspace) -> list[str]:
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    for minute, cost in enumerate(["0.5", "0.25", "0.125", "1"]):
        with (
            time_machine.travel(START + dt.timedelta(minutes=minute), tick=False),
            transaction.atomic(),
        ):
            events_record(
                task=task,
                run=run,
                events=[
                    PendingEvent(
                        "agent.model.turn.completed",
                        {"turn_no": minute + 1, "tokens_in": 7, "tokens_out": 3, "cost_usd": cost},
                    )
                ],
            )
    return [
        str(e)
        for e in OutboxEvent.objects.filter(payload__taskid=str(task.id))
        .order_by("id")
        .values_list("event_id", flat=True)
    ]


def _state(workspace) -> tuple:
    row = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    return row.day, row.cost_usd, row.tokens_in, row.tokens_out, row.model_turns, row.last_event_at


@pytest.mark.django_db(transaction=True)
def test_out_of_order_delivery_reaches_the_in_order_state():
    in_order, shuffled = WorkspaceFactory(), WorkspaceFactory()
    for event_id in _turns(in_order):
        event_consume(consumer="cost_aggregation", event_id=event_id)
    ids = _turns(shuffled)
    for event_id in [ids[3], ids[1], ids[3], ids[0], ids[2], ids[1]]:
        event_consume(consumer="cost_aggregation", event_id=event_id)

    assert _state(shuffled) == _state(in_order)
    day, cost, *_, last = _state(shuffled)
    assert (day, str(cost), last) == (START.date(), "1.875000", START + dt.timedelta(minutes=3))
