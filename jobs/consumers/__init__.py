"""In-app event consumers: each runs as Celery messages and is idempotent per event.

A consumer's handler may do slow work first (an HTTP call, made idempotent by its own
key) and returns the database write that completes it. That write runs in ONE
transaction with the consumer's ProcessedEvent receipt ``(consumer, event_id)``: either
both commit or neither, so a redelivered, duplicated or replayed event changes nothing
twice. Consumers read only the fields they need and ignore the rest, so producers can
add fields without breaking them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from jobs import metrics, sql, tracing
from jobs.logs import log
from jobs.models import OutboxEvent, ProcessedEvent
from jobs.work import WorkDeferred, work_enqueue, work_kind


class PermanentConsumerError(Exception):
    """The event can never be handled as it is (bad data, a 4xx): dead-letter, no retry."""


@dataclass(frozen=True)
class Event:
    """The fields of a CloudEvent that consumers use; anything else is ignored."""

    id: str
    type: str
    time: datetime | None
    data: Mapping[str, Any]
    workspace_id: int | None
    task_id: str | None
    run_id: str | None
    sequence: int | None

    @classmethod
    def from_envelope(cls, payload: Mapping[str, Any]) -> Event:
        workspace = payload.get("workspaceid")
        sequence = payload.get("sequence")
        time = payload.get("time")
        return cls(
            id=str(payload["id"]),
            type=str(payload["type"]),
            time=parse_datetime(time) if isinstance(time, str) else None,
            data=payload.get("data") or {},
            workspace_id=int(workspace) if workspace is not None and workspace != "" else None,
            task_id=payload.get("taskid"),
            run_id=payload.get("runid"),
            sequence=int(sequence) if sequence is not None else None,
        )


# What a handler returns: the write that completes it (run with the receipt), or None
# when the event needs no write (the receipt alone is recorded).
Completion = Callable[[], None] | None


@dataclass(frozen=True)
class Consumer:
    name: str
    # Exact event types, or prefixes ending in "*".
    types: tuple[str, ...]
    handle: Callable[[Event], Completion]

    def wants(self, event_type: str) -> bool:
        return any(
            event_type.startswith(t[:-1]) if t.endswith("*") else event_type == t
            for t in self.types
        )


@cache
def _load(paths: tuple[str, ...]) -> dict[str, Consumer]:
    consumers = [import_string(path) for path in paths]
    return {c.name: c for c in consumers}


def consumers_registered() -> dict[str, Consumer]:
    """The consumers named in settings.EVENT_CONSUMERS, by name."""
    return _load(tuple(settings.EVENT_CONSUMERS))


def consumers_for(event_type: str) -> list[Consumer]:
    return [c for c in consumers_registered().values() if c.wants(event_type)]


def processed_claim(*, consumer: str, event_id: str) -> bool:
    """Insert the consumer's receipt for the event; False if it already exists.

    Call inside the transaction of the side effect. A concurrent duplicate blocks on the
    unique index until the first commits, then finds the row and gets False.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("processed_claim must run inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute(sql.PROCESSED_EVENT_INSERT, [consumer, uuid.UUID(event_id)])
        return cursor.fetchone() is not None


# Events one consumer work item carries at most: the relay writes one item per consumer
# and batch instead of one per event, and the item's lease must outlast its handlers.
CONSUME_BATCH = 100


def consume_key(consumer: str, event_ids: list[str]) -> str:
    """The work item key of a consumer's delivery: one event, or a batch named by its first.

    The two shapes never collide, so a batch can hand its events to single-event items.
    """
    if len(event_ids) == 1:
        return f"{consumer}:{event_ids[0]}"
    return f"{consumer}:batch:{event_ids[0]}:{len(event_ids)}"


def event_consume(
    *, consumer: str, event_id: str | None = None, event_ids: list[str] | None = None
) -> str:
    """Let ``consumer`` handle each event once, in the order given.

    One event: processed, duplicate or missing. A batch (``event_ids``): the events are
    handled one after another, each in its own transaction with its receipt, so events
    done before a failure stay done. The first event that raises is handed, with the
    events after it, to single-event work items: each then retries (and, if it must,
    is dead-lettered) on its own, and the batch is finished ("split").
    """
    spec = consumers_registered().get(consumer)
    if spec is None:
        raise PermanentConsumerError(f"no consumer named {consumer!r}")
    if event_id is not None:
        return _consume_one(spec, event_id)
    ids = [str(e) for e in event_ids or []]
    done = {
        str(e)
        for e in ProcessedEvent.objects.filter(consumer=consumer, event_id__in=ids).values_list(
            "event_id", flat=True
        )
    }
    payloads = {
        str(e): payload
        for e, payload in OutboxEvent.objects.filter(
            event_id__in=[e for e in ids if e not in done]
        ).values_list("event_id", "payload")
    }
    for index, current in enumerate(ids):
        if current in done:
            metrics.consumer_events.labels(consumer, "duplicate").inc()
            continue
        try:
            _consume_one(spec, current, payload=payloads.get(current))
        except Exception as exc:
            rest = [e for e in ids[index + 1 :] if e not in done]
            _split(spec, failed=current, rest=rest, error=exc)
            log.warning(
                "consumer.batch_split",
                consumer=consumer,
                event_id=current,
                remaining=len(ids) - index,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            return "split"
    return "processed"


def _split(spec: Consumer, *, failed: str, rest: list[str], error: Exception) -> None:
    """Single-event work items for a failed event and the rest. The failed one is due
    after the retry delay, or after the wait a deferral (``WorkDeferred``) named."""
    if isinstance(error, WorkDeferred):
        delay = error.seconds
    else:
        delay = work_kind("event.consume").retry_base_seconds
    _singles(spec.name, [(failed, delay), *((e, 0.0) for e in rest)])


def _singles(consumer: str, events: list[tuple[str, float]]) -> None:
    with transaction.atomic():
        for current, delay in events:
            work_enqueue(
                kind="event.consume",
                key=consume_key(consumer, [current]),
                args={"consumer": consumer, "event_id": current},
                delay=delay,
            )


def event_batch_split(
    *, consumer: str, event_id: str | None = None, event_ids: list[str] | None = None
) -> bool:
    """Hand a batch's unprocessed events to single-event items (after a worker died
    holding the batch: one of them may be what kills it); False for a single event."""
    ids = [str(e) for e in event_ids or []]
    if event_id is not None or len(ids) < 2:
        return False
    done = {
        str(e)
        for e in ProcessedEvent.objects.filter(consumer=consumer, event_id__in=ids).values_list(
            "event_id", flat=True
        )
    }
    rest = [e for e in ids if e not in done]
    _singles(consumer, [(e, 0.0) for e in rest])
    log.warning("consumer.batch_split_after_crash", consumer=consumer, remaining=len(rest))
    return True


_UNREAD = object()


def _consume_one(spec: Consumer, event_id: str, *, payload: Any = _UNREAD) -> str:
    consumer = spec.name
    if payload is _UNREAD:
        if ProcessedEvent.objects.filter(consumer=consumer, event_id=event_id).exists():
            metrics.consumer_events.labels(consumer, "duplicate").inc()
            return "duplicate"
        payload = (
            OutboxEvent.objects.filter(event_id=event_id).values_list("payload", flat=True).first()
        )
    if payload is None:
        # The outbox row was pruned: nothing left to act on.
        log.warning("consumer.event_missing", consumer=consumer, event_id=event_id)
        return "missing"
    tracing.event_bind(payload)
    event = Event.from_envelope(payload)
    completion = spec.handle(event)
    with transaction.atomic():
        if not processed_claim(consumer=consumer, event_id=event_id):
            metrics.consumer_events.labels(consumer, "duplicate").inc()
            return "duplicate"
        if completion is not None:
            completion()
    metrics.consumer_events.labels(consumer, "processed").inc()
    return "processed"
