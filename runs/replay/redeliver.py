"""The runs side of re-delivery: envelopes from the run timeline, for jobs.redelivery.

The timeline outlives the outbox (retention prunes published outbox rows), and a
timeline event and its outbox event share their id. An event whose outbox row still
exists is re-delivered with exactly the envelope that was published; a pruned one gets
its envelope rebuilt from the timeline row (same id, type, data, sequence and time), so
a consumer's receipt for it is found either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import Q

from jobs.models import OutboxEvent
from runs.models import Run, RunEvent, Task
from runs.timeline import envelope

CHUNK = 500


def _rebuilt(event: RunEvent, tasks: dict[Any, Task]) -> dict[str, Any]:
    run = event.run
    task = tasks.setdefault(run.task_id, run.task)
    payload = envelope(
        event_id=event.id,
        type=event.type,
        task=task,
        run=run,
        data=event.data,
        sequence=event.sequence_no,
    )
    payload["time"] = event.created_at.isoformat().replace("+00:00", "Z")
    return payload


def timeline_envelopes(
    *,
    run_id: Any = None,
    workspace_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Iterator[dict[str, Any]]:
    """Timeline events as envelopes, in order: by time, then run and sequence."""
    query = Q()
    if run_id is not None:
        query &= Q(run_id=run_id)
    if workspace_id is not None:
        query &= Q(run__workspace_id=workspace_id)
    if since is not None:
        query &= Q(created_at__gte=since)
    if until is not None:
        query &= Q(created_at__lt=until)
    events = (
        RunEvent.objects.filter(query)
        .select_related("run", "run__task", "run__task__workspace")
        .order_by("created_at", "run_id", "sequence_no")
    )
    tasks: dict[Any, Task] = {}
    chunk: list[RunEvent] = []
    for event in events.iterator(chunk_size=CHUNK):
        chunk.append(event)
        if len(chunk) == CHUNK:
            yield from _envelopes_of(chunk, tasks)
            chunk = []
    yield from _envelopes_of(chunk, tasks)


def _envelopes_of(chunk: list[RunEvent], tasks: dict[Any, Task]) -> Iterator[dict[str, Any]]:
    published = dict(
        OutboxEvent.objects.filter(event_id__in=[e.id for e in chunk]).values_list(
            "event_id", "payload"
        )
    )
    for event in chunk:
        yield published.get(event.id) or _rebuilt(event, tasks)


def run_envelopes(run: Run) -> Iterator[dict[str, Any]]:
    return timeline_envelopes(run_id=run.id)
