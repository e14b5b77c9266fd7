"""The timeline: run events with gap-free sequence numbers, mirrored into the outbox.

Every fact is written twice in one transaction: as a RunEvent (the run's timeline, what
operators read) and as an OutboxEvent (what the relay publishes). Neither exists without
the other, and neither exists without the state change that caused it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from structlog.contextvars import bind_contextvars, get_contextvars

from agentplatform.metrics import events_observe
from jobs import relay
from jobs.ids import new_id
from jobs.models import OutboxEvent
from jobs.tracing import event_trace_parent, event_traceparent, traceparent_new
from runs.models import Run, RunEvent, Task

EVENT_VERSION = "1"


@dataclass
class PendingEvent:
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    actor: str = ""


def traceparent_for(task: Task) -> str:
    """W3C traceparent: the trace of the request or step recording it, else the task's."""
    return event_traceparent(task)


def envelope(
    *,
    event_id: uuid.UUID,
    type: str,
    task: Task,
    run: Run | None,
    data: Mapping[str, Any],
    sequence: int | None,
    causation_id: str | None = None,
) -> dict[str, Any]:
    """The CloudEvents 1.0 envelope with our extensions (docs/design.md §5)."""
    return _envelope_of(
        _envelope_common(task=task, run=run, causation_id=causation_id),
        event_id=event_id,
        type=type,
        data=data,
        sequence=sequence,
    )


@dataclass(frozen=True)
class _EnvelopeCommon:
    """What the envelopes of one batch of a task's (and run's) events share."""

    fields: dict[str, Any]
    parent: tuple[str, str]  # the trace id and flags each event's span continues


def _envelope_common(*, task: Task, run: Run | None, causation_id: str | None) -> _EnvelopeCommon:
    task_id = str(task.id)
    fields: dict[str, Any] = {
        "specversion": "1.0",
        "source": f"{settings.EVENT_SOURCE}/workspaces/{task.workspace_id}",
        "subject": f"runs/{run.id}" if run is not None else f"tasks/{task_id}",
        "time": timezone.now().isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "eventversion": EVENT_VERSION,
        "workspaceid": str(task.workspace_id),
        "taskid": task_id,
        "correlationid": task_id,
    }
    if run is not None:
        fields["runid"] = str(run.id)
    if causation_id:
        fields["causationid"] = causation_id
    return _EnvelopeCommon(fields=fields, parent=event_trace_parent(task))


def _envelope_of(
    common: _EnvelopeCommon,
    *,
    event_id: uuid.UUID,
    type: str,
    data: Mapping[str, Any],
    sequence: int | None,
) -> dict[str, Any]:
    body = {
        **common.fields,
        "id": str(event_id),
        "type": type,
        "data": dict(data),
        # Each event is a span of its own in the trace it continues.
        "traceparent": traceparent_new(*common.parent),
    }
    if sequence is not None:
        body["sequence"] = sequence
    return body


def _sequence_reserve(run_id: uuid.UUID, count: int) -> int:
    """Reserve ``count`` sequence numbers for a run; returns the last one reserved.

    The UPDATE takes the run's row lock until the transaction ends, so concurrent
    appenders queue behind each other and a rollback returns the numbers: gap-free. The
    number read after it is this transaction's, under that lock.
    """
    runs = Run.objects.filter(pk=run_id)
    if not runs.update(last_sequence_no=F("last_sequence_no") + count):
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return int(runs.values_list("last_sequence_no", flat=True).get())


def events_record(
    *,
    task: Task,
    run: Run | None,
    events: Iterable[PendingEvent],
    causation_id: str | None = None,
    reserved: tuple[int, int] | None = None,
) -> list[RunEvent]:
    """Append events to the run's timeline and to the outbox, in the current transaction.

    ``reserved`` is ``(last, count)`` when the caller already reserved ``count`` sequence
    numbers ending at ``last`` in this transaction (the step's fenced UPDATE does, to save
    a round trip); the first ``count`` events take them, any further ones are reserved
    here. The run's row lock, held since that reservation, keeps the numbers contiguous.
    """
    pending = list(events)
    if run is not None and reserved is not None and reserved[1] > len(pending):
        raise ValueError("more sequence numbers reserved than events to record")
    if not pending:
        return []
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("events_record must run inside transaction.atomic()")
    sequences: list[int] = []
    if run is not None:
        last, count = reserved or (0, 0)
        sequences = list(range(last - count + 1, last + 1))
        if len(pending) > count:
            last = _sequence_reserve(run.id, len(pending) - count)
            sequences += range(last - (len(pending) - count) + 1, last + 1)
        run.last_sequence_no = last
    recorded, outbox = _rows_of(
        task=task, run=run, events=pending, sequences=sequences, causation_id=causation_id
    )
    RunEvent.objects.bulk_create(recorded)
    OutboxEvent.objects.bulk_create(outbox)
    events_recorded(task=task, run=run, events=pending)
    return recorded


def _rows_of(
    *,
    task: Task,
    run: Run | None,
    events: list[PendingEvent],
    sequences: list[int],
    causation_id: str | None = None,
) -> tuple[list[RunEvent], list[OutboxEvent]]:
    """The timeline's and the outbox's rows of ``events`` (not yet written)."""
    prepared = events_prepare(
        task=task, run=run, events=events, sequences=sequences, causation_id=causation_id
    )
    recorded = [
        RunEvent(
            id=event.id,
            run=run,
            sequence_no=event.sequence,
            type=event.type,
            data=event.data,
            actor=event.actor,
        )
        for event in prepared
        if run is not None and event.sequence is not None
    ]
    outbox = [
        OutboxEvent(
            event_id=event.id,
            type=event.type,
            partition_key=event.partition_key,
            payload=event.payload,
        )
        for event in prepared
    ]
    return recorded, outbox


@dataclass
class PreparedEvent:
    """One event's rows before they are written: the timeline's (when it has a
    sequence number) and the outbox's (``payload``, the envelope)."""

    id: uuid.UUID
    type: str
    data: dict[str, Any]
    actor: str
    sequence: int | None
    partition_key: str
    payload: dict[str, Any]


def events_prepare(
    *,
    task: Task,
    run: Run | None,
    events: list[PendingEvent],
    sequences: list[int],
    causation_id: str | None = None,
) -> list[PreparedEvent]:
    """Ids and envelopes of ``events``; the i-th of a run's events takes ``sequences[i]``."""
    common = _envelope_common(task=task, run=run, causation_id=causation_id)
    partition_key = common.fields.get("runid") or common.fields["taskid"]
    prepared = []
    for offset, event in enumerate(events):
        event_id = new_id()
        sequence = sequences[offset] if run is not None else None
        prepared.append(
            PreparedEvent(
                id=event_id,
                type=event.type,
                data=event.data,
                actor=event.actor,
                sequence=sequence,
                partition_key=partition_key,
                payload=_envelope_of(
                    common, event_id=event_id, type=event.type, data=event.data, sequence=sequence
                ),
            )
        )
    return prepared


def events_recorded(*, task: Task, run: Run | None, events: list[PendingEvent]) -> None:
    """What follows writing events in the current transaction: log lines name the task,
    and on commit the metrics, the relay's wake-up and the live views' announcement."""
    # A request acting on one task (a submission, a command): its later lines say which.
    # Sweeps touch many tasks and bind per run themselves.
    bound = get_contextvars()
    if "request_id" in bound and bound.get("task_id") in (None, str(task.id)):
        bind_contextvars(workspace_id=task.workspace_id, task_id=str(task.id))
    transaction.on_commit(partial(events_observe, task, run, events), robust=True)
    if run is not None:
        # The relay's wake-up and the live views' announcement share a round trip.
        transaction.on_commit(partial(_wake_relay_announce, run.id, run.last_sequence_no))
    else:
        transaction.on_commit(_wake_relay)


def event_record(
    *,
    task: Task,
    run: Run | None,
    type: str,
    data: Mapping[str, Any] | None = None,
    actor: str = "",
) -> RunEvent | None:
    """Record one event; see events_record."""
    recorded = events_record(
        task=task, run=run, events=[PendingEvent(type=type, data=dict(data or {}), actor=actor)]
    )
    return recorded[0] if recorded else None


def system_event_record(
    *, type: str, data: Mapping[str, Any], partition_key: str, workspace_id: int | None = None
) -> OutboxEvent:
    """An event about the platform itself (not a task), e.g. a dead-lettered job."""
    event_id = new_id()
    payload: dict[str, Any] = {
        "specversion": "1.0",
        "id": str(event_id),
        "source": f"{settings.EVENT_SOURCE}/system",
        "type": type,
        "subject": partition_key,
        "time": timezone.now().isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "data": dict(data),
        "eventversion": EVENT_VERSION,
    }
    if workspace_id is not None:
        payload["workspaceid"] = str(workspace_id)
    row = OutboxEvent.objects.create(
        event_id=event_id, type=type, partition_key=partition_key, payload=payload
    )
    transaction.on_commit(_wake_relay)
    return row


def run_announcement(*, run_id: uuid.UUID | str, sequence: int) -> tuple[str, str]:
    """The channel and message that announce a run's events up to ``sequence``."""
    return relay.run_channel(run_id), json.dumps({"run_id": str(run_id), "sequence": sequence})


def _wake_relay_announce(run_id: uuid.UUID, sequence: int) -> None:
    relay.relay_wake(publish=run_announcement(run_id=run_id, sequence=sequence))


def _wake_relay() -> None:
    relay.relay_wake()
