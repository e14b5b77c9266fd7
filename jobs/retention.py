"""Retention: delivery history is deleted once nothing can read it again.

The platform keeps tasks, runs, their timelines, artifacts and dead letters for good.
The rows that only carried work to its end grow with every event and every delivery,
and nothing reads them after a while:

- published outbox rows, the consumers' receipts (``ProcessedEvent``) and finished work
  items, after ``OUTBOX_RETENTION_DAYS``. Pending rows are never deleted, nor the
  events of the types a domain app keeps (``outbox_types_keep``: ``runs`` keeps a
  deferred submission's deferral, from which its replay rebuilds the answer). Work
  that may still read events (a consumer's or a subscription's delivery that is
  pending, or dead with its letter open) holds the cutoff back to the time it was
  created, so a retry or a requeue finds its events and their receipts.
- processed or ignored webhook receipts, after ``WEBHOOK_RECEIPT_RETENTION_DAYS``
  (registered by ``webhooks``). GitHub and GitLab redeliver for days, not weeks.

A value of 0 keeps the rows for good. Beat runs ``retention_sweep`` every five minutes;
each sweep deletes in batches (each its own short transaction, ``SKIP LOCKED``, so
concurrent sweeps take different rows) for a bounded time, and the next one goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import CharField, Exists, Min, Model, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from jobs import metrics
from jobs.logs import log
from jobs.models import DeadLetter, OutboxEvent, ProcessedEvent, WorkItem


@dataclass(frozen=True)
class Retention:
    """Rows of ``model`` that ``expired`` selects for a cutoff are deleted once
    ``cutoff`` (given the sweep's time) gives one; None keeps them.

    ``born`` is the column set when a row is inserted: rows are inserted in id order, so
    those born before the cutoff are a prefix of the ids, and a sweep reads only that
    prefix, not the rows still kept. (A row stamped by a host whose clock lags behind
    goes as many sweeps later as its clock lags.)
    """

    name: str
    model: type[Model]
    cutoff: Callable[[datetime], datetime | None]
    expired: Callable[[datetime], Q]
    born: str = "created_at"


_registered: dict[str, Retention] = {}


def retention_register(retention: Retention) -> None:
    _registered[retention.name] = retention


def retentions_registered() -> list[Retention]:
    return list(_registered.values())


# Event types whose published outbox rows are kept for good (``outbox_types_keep``).
_outbox_kept: set[str] = set()


def outbox_types_keep(*types: str) -> None:
    """Keep the published outbox rows of ``types`` for good: a domain app that reads
    them back registers them (from its ``AppConfig.ready``)."""
    _outbox_kept.update(types)


def _outbox_expired(cutoff: datetime) -> Q:
    return Q(published_at__lt=cutoff) & ~Q(type__in=sorted(_outbox_kept))


def days_before(now: datetime, days: float) -> datetime | None:
    """``now`` less ``days``; None (keep for good) for 0 or less."""
    return now - timedelta(days=days) if days > 0 else None


# The work kinds that read outbox rows by event id, and their consumers' receipts.
EVENT_READERS = ("event.consume", "subscription.deliver")
# A reader's item is created in the relay's transaction that publishes its events; the
# margin covers clocks of processes that stamp the two.
_READER_MARGIN = timedelta(hours=1)


def event_readers_open_since() -> datetime | None:
    """When the oldest work that may still read events was created: a consumer's or a
    subscription's delivery that is pending, or dead with its dead letter open."""
    letter_open = DeadLetter.objects.filter(
        status=DeadLetter.Status.OPEN,
        task_id=Concat(Value("work:"), Cast(OuterRef("pk"), CharField())),
    )
    open_items = WorkItem.objects.filter(kind__in=EVENT_READERS).filter(
        Q(status=WorkItem.Status.PENDING) | (Q(status=WorkItem.Status.DEAD) & Exists(letter_open))
    )
    oldest: datetime | None = open_items.aggregate(oldest=Min("created_at"))["oldest"]
    return oldest


def events_cutoff(now: datetime) -> datetime | None:
    """The outbox's, its receipts' and finished work's cutoff: the retention, held back
    by the oldest work that may still read events."""
    cutoff = days_before(now, settings.OUTBOX_RETENTION_DAYS)
    if cutoff is None:
        return None
    oldest = event_readers_open_since()
    if oldest is not None and oldest - _READER_MARGIN < cutoff:
        log.info("retention.held_back", cutoff=cutoff.isoformat(), reader_since=oldest.isoformat())
        return oldest - _READER_MARGIN
    return cutoff


retention_register(
    Retention(
        name="outbox",
        model=OutboxEvent,
        cutoff=events_cutoff,
        expired=_outbox_expired,
    )
)
retention_register(
    Retention(
        name="processed_events",
        model=ProcessedEvent,
        cutoff=events_cutoff,
        expired=lambda cutoff: Q(processed_at__lt=cutoff),
        born="processed_at",
    )
)
retention_register(
    Retention(
        name="work_items",
        model=WorkItem,
        cutoff=events_cutoff,
        expired=lambda cutoff: Q(status=WorkItem.Status.DONE, finished_at__lt=cutoff),
    )
)


@dataclass
class RetentionReport:
    deleted: dict[str, int] = field(default_factory=dict)
    # Whether a table still had expired rows when the sweep's time ran out.
    more: bool = False


def retention_sweep(
    *, max_seconds: float | None = None, batch: int | None = None, now: datetime | None = None
) -> RetentionReport:
    """Delete what each registered retention lets go, in batches, for up to
    ``max_seconds`` (``RETENTION_SWEEP_SECONDS``)."""
    max_seconds = settings.RETENTION_SWEEP_SECONDS if max_seconds is None else max_seconds
    batch = settings.RETENTION_BATCH if batch is None else batch
    now = now or timezone.now()
    deadline = time.monotonic() + max_seconds
    report = RetentionReport()
    # Retentions that share a cutoff (the outbox's family) read it once per sweep.
    cutoffs: dict[Callable[[datetime], datetime | None], datetime | None] = {}
    for retention in retentions_registered():
        if retention.cutoff not in cutoffs:
            cutoffs[retention.cutoff] = retention.cutoff(now)
        cutoff = cutoffs[retention.cutoff]
        if cutoff is None:
            continue
        deleted, more = _prune(retention, cutoff=cutoff, batch=batch, deadline=deadline)
        report.deleted[retention.name] = deleted
        report.more = report.more or more
        if deleted:
            metrics.retention_deleted.labels(retention.name).inc(deleted)
    if any(report.deleted.values()) or report.more:
        log.info("retention.swept", deleted=report.deleted, more=report.more)
    return report


def _prune(
    retention: Retention, *, cutoff: datetime, batch: int, deadline: float
) -> tuple[int, bool]:
    """Delete the expired rows born before ``cutoff``; (how many, whether any are left)."""
    model = retention.model
    label = model._meta.label
    # The first id born at or after the cutoff, read along the primary key from its
    # start: a walk over the rows that are about to go.
    boundary = (
        model._default_manager.filter(**{f"{retention.born}__gte": cutoff})
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )
    expired = retention.expired(cutoff)
    after: Any = None
    deleted = 0
    while time.monotonic() < deadline:
        rows = model._default_manager.filter(expired)
        if boundary is not None:
            rows = rows.filter(pk__lt=boundary)
        if after is not None:
            rows = rows.filter(pk__gt=after)
        with transaction.atomic():
            ids = list(
                rows.order_by("pk")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:batch]
            )
            if not ids:
                return deleted, False
            # The condition again: a row that changed since it was read stays.
            _, by_model = model._default_manager.filter(expired, pk__in=ids).delete()
        deleted += by_model.get(label, 0)
        after = ids[-1]
        if len(ids) < batch:
            return deleted, False
    return deleted, True
