"""The rows written at the platform's rate take time-ordered ids (UUIDv7): each new key
lands next to the last one in its B-tree index instead of on a random page."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from jobs.ids import new_id
from jobs.models import OutboxEvent
from runs.models import RunEvent
from runs.services import task_submit
from runs.timeline import system_event_record

pytestmark = pytest.mark.django_db


def _increasing(ids: list[uuid.UUID]) -> bool:
    return all(a < b for a, b in pairwise(ids)) and all(i.version == 7 for i in ids)


def _moment(value: uuid.UUID) -> datetime:
    return datetime.fromtimestamp((value.int >> 80) / 1000, tz=UTC)


def test_new_ids_are_uuid7_in_the_order_they_were_made() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert isinstance(ids[0], uuid.UUID)
    assert _increasing(ids)
    assert abs(_moment(ids[-1]) - datetime.now(UTC)) < timedelta(seconds=5)


def test_tasks_runs_events_and_outbox_take_time_ordered_ids(repository: Any) -> None:
    for limited in (repository, repository.workspace):
        limited.max_active_runs = 10
        limited.save()
    submissions = [
        task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction=f"change {n}",
            idempotency_key=f"key-{n}",
        )
        for n in range(5)
    ]
    tasks = [s.task.pk for s in submissions]
    runs = [s.run.pk for s in submissions]
    assert _increasing(tasks)
    assert _increasing(runs)
    events = list(RunEvent.objects.order_by("created_at", "run_id", "sequence_no"))
    assert len(events) == 20
    # Within a submission and from one submission to the next, in the order written.
    assert _increasing(
        [e.id for e in sorted(events, key=lambda e: (runs.index(e.run_id), e.sequence_no))]
    )
    outbox = list(OutboxEvent.objects.order_by("id").values_list("event_id", flat=True))
    assert _increasing(outbox)
    task = submissions[0].task
    task.refresh_from_db()
    assert abs(_moment(task.pk) - task.created_at) < timedelta(seconds=5)


def test_platform_events_take_time_ordered_ids(db: Any) -> None:
    first = system_event_record(type="agent.job.dead_lettered", data={}, partition_key="x")
    second = system_event_record(type="agent.job.dead_lettered", data={}, partition_key="x")
    assert _increasing([first.event_id, second.event_id])


def test_names_made_from_ids_differ_for_ids_of_the_same_millisecond() -> None:
    from runs.models import Run, Task
    from runs.steps.preparing import task_branch

    made = [new_id() for _ in range(200)]
    assert len({_moment(i) for i in made}) < len(made)  # several share a millisecond
    branches = {task_branch(Task(id=i)) for i in made}
    assert len(branches) == len(made)
    assert all(b.startswith("agent/") and len(b) == len("agent/") + 12 for b in branches)
    assert len({Run(id=i).short_id for i in made}) == len(made)
