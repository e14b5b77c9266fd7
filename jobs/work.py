"""Work items: every unit of work that is not a run step lives in a row.

A producer calls ``work_enqueue`` inside the transaction that creates the need (a webhook
receipt, a published event), so the work exists exactly when its cause does. After
commit a message wakes a worker; if that send fails or the message dies with the broker,
the row is still pending and ``work_sweep`` (beat, advisory-locked, capped per tick) wakes
it again once it is overdue. Items created by a request (a webhook delivery) are woken
per queue, not per item: one ``jobs.work_drain`` task, queued or running, claims and runs
the queue's pending items one after the other (see ``work_wake_new``).

A worker claims the row with a lease before calling the kind's handler
(``jobs.work_execution``). Handlers are
idempotent (receipts, ProcessedEvent rows, notification rows), so running one again after
a crash repeats nothing. A claim that finds an expired lease knows the previous worker
died holding it: after ``WORK_POISON_CRASHES`` such deaths the item is dead-lettered as
poison instead of killing workers forever. Ordinary failures retry with backoff until
the kind's ``max_attempts``, then become dead letters. A handler that must wait for
someone else (another holder's lease on its side effect) raises ``WorkDeferred``: the
item comes back when the wait is over without spending an attempt, so a holder that
died mid-call never turns its waiting successors into dead letters. A requeue sets the
same row pending again in the transaction that reopens the letter, so nothing is sent
that could be lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs import sql, tracing
from jobs.coalescing import coalescing_client as _coalescing_client
from jobs.locks import sweep_lock
from jobs.logs import log
from jobs.models import DeadLetter, WorkItem

WORK_TASK = "jobs.work"


class PermanentWorkError(Exception):
    """The work can never succeed as it is: dead-letter it without retrying."""


class WorkDeferred(Exception):
    """The work cannot go on for ``seconds`` yet (another holder's lease, which ends by
    itself): run it again then, and give back the attempt this run spent. Past its
    kind's ``max_deferrals`` a deferral spends the attempt like any failure, so work
    that never stops deferring ends as a dead letter instead of waiting for ever."""

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = max(0.0, float(seconds))


@dataclass(frozen=True)
class WorkKind:
    name: str
    handler: Callable[..., Any]
    queue: str = "events"
    max_attempts: int = 6
    retry_base_seconds: float = 2.0
    retry_max_seconds: float = 600.0
    # Deferrals (WorkDeferred) that give back their attempt; the ones after them count.
    max_deferrals: int = 50
    # Exceptions that mean "never retry" besides PermanentWorkError.
    permanent: tuple[type[BaseException], ...] = field(default_factory=tuple)
    # For items that bundle several units of work: ``split(**item.args)`` hands the
    # units to items of their own and returns True. Called instead of the handler once
    # a worker died holding the item, so one poison unit is isolated (and dead-lettered
    # alone) instead of taking its whole bundle with it.
    split: Callable[..., bool] | None = None


_kinds: dict[str, WorkKind] = {}


def work_kind_register(kind: WorkKind) -> None:
    """Declare a kind of work and its handler (``handler(**item.args)``)."""
    _kinds[kind.name] = kind


def work_kind(name: str) -> WorkKind:
    try:
        return _kinds[name]
    except KeyError:
        raise PermanentWorkError(f"no kind of work named {name!r}") from None


# --- producing ---------------------------------------------------------------------------


def work_enqueue(
    *,
    kind: str,
    key: str,
    args: dict[str, Any],
    delay: float = 0.0,
    reopen: bool = False,
    traceparent: str = "",
    wake: bool = True,
) -> WorkItem | None:
    """Record work to do and wake a worker on commit; None if it already exists.

    Must run inside the transaction that creates the work's cause. With ``reopen`` an
    existing item (done or dead) is set pending again, for an operator's replay.
    ``wake=False`` is for a caller that executes the item itself right after the commit
    (``work_execute``): no message is sent, and if that execution never happens the
    sweep wakes the item ``WORK_REWAKE_SECONDS`` after its creation.
    """
    spec = work_kind(kind)
    now = timezone.now()
    try:
        with transaction.atomic():
            item = WorkItem.objects.create(
                kind=kind,
                key=key,
                args=args,
                queue=spec.queue,
                due_at=now + timedelta(seconds=delay),
                traceparent=traceparent or tracing.traceparent_current() or "",
            )
    except IntegrityError:
        if not reopen:
            return None
        item = WorkItem.objects.select_for_update().get(kind=kind, key=key)
        _reopen(item, args=args)
    if wake:
        work_wake_on_commit([item])
    return item


def work_enqueue_new(*, kind: str, key: str, args: dict[str, Any], wake: bool = True) -> WorkItem:
    """Record the work of a cause inserted (or fenced) in this same transaction; woken on
    commit.

    The cause is new, so no item with its key can exist yet: the row is inserted without
    the savepoint ``work_enqueue`` needs to survive a duplicate (a conflict here would be
    a bug, and fails the transaction). Its first wake-up is not recorded either: the
    sweep measures an unwoken item's wait from its ``created_at``, which is when that
    wake-up goes, so the record would cost a write per item and change nothing.
    ``wake=False`` as for ``work_enqueue``: the caller executes the item itself
    (``work_execute``) right after the commit.
    """
    item = _item_new(kind=kind, key=key, args=args)
    item.save(force_insert=True)
    if wake:
        work_wake_new_on_commit(item.queue)
    return item


def _item_new(*, kind: str, key: str, args: dict[str, Any]) -> WorkItem:
    """An unsaved item of ``kind``, due now, on its kind's queue, in the current trace."""
    return WorkItem(
        kind=kind,
        key=key,
        args=args,
        queue=work_kind(kind).queue,
        due_at=timezone.now(),
        traceparent=tracing.traceparent_current() or "",
    )


def work_insert_when(
    *, kind: str, key: str, args: dict[str, Any], when: tuple[str, list[Any]]
) -> tuple[str, list[Any]]:
    """The INSERT of ``work_enqueue_new(..., wake=False)`` as (statement, parameters),
    made only if ``when`` (SQL, parameters) holds, returning the new item's id, for a
    writer that runs the item itself once its transaction committed
    (``jobs.sql.work_insert_when``)."""
    return sql.work_insert_when(_item_new(kind=kind, key=key, args=args), when)


def work_enqueue_many(
    *, kind: str, entries: Iterable[tuple[str, dict[str, Any], str]]
) -> list[WorkItem]:
    """Record many items of one kind at once (existing keys are skipped); woken on commit.

    Each entry is (key, args, traceparent).
    """
    spec = work_kind(kind)
    now = timezone.now()
    rows = [
        WorkItem(
            kind=kind, key=key, args=args, queue=spec.queue, due_at=now, traceparent=trace or ""
        )
        for key, args, trace in entries
    ]
    if not rows:
        return []
    created = WorkItem.objects.bulk_create(rows, ignore_conflicts=True)
    # ignore_conflicts leaves pk unset: read back the ones that are still to wake.
    keys = [row.key for row in created]
    fresh = list(
        WorkItem.objects.filter(
            kind=kind, key__in=keys, status=WorkItem.Status.PENDING, woken_at__isnull=True
        )
    )
    work_wake_on_commit(fresh)
    return fresh


def _reopen(item: WorkItem, *, args: dict[str, Any] | None = None) -> None:
    WorkItem.objects.filter(pk=item.pk).update(
        status=WorkItem.Status.PENDING,
        args=item.args if args is None else args,
        due_at=timezone.now(),
        attempts=0,
        crashes=0,
        deferrals=0,
        wakes=0,
        woken_at=None,
        lease_until=None,
        claim="",
        finished_at=None,
    )
    item.refresh_from_db()


# --- waking ------------------------------------------------------------------------------


def work_wake_on_commit(items: list[WorkItem]) -> None:
    if items:
        pairs = [(item.pk, item.queue) for item in items]
        transaction.on_commit(lambda: work_wake(pairs))


def work_wake(pairs: list[tuple[int, str]], *, countdown: float = 0.0, record: bool = True) -> int:
    """Send one wake-up per item; record it only once the broker took it.

    A refused send leaves ``woken_at`` as it was, so the sweep sees the item overdue.
    ``record=False`` is for the first wake-up of items created just now (see
    ``work_enqueue_new``). Returns how many were sent.
    """
    from celery import current_app

    sent: list[int] = []
    try:
        with current_app.producer_or_acquire() as producer:
            for pk, queue in pairs:
                current_app.send_task(
                    WORK_TASK,
                    args=(pk,),
                    queue=queue,
                    countdown=countdown or None,
                    producer=producer,
                )
                sent.append(pk)
    except Exception:
        log.warning("work.wake_failed", sent=len(sent), unsent=len(pairs) - len(sent))
    if sent and record:
        due = timezone.now() + timedelta(seconds=countdown)
        try:
            WorkItem.objects.filter(pk__in=sent).update(woken_at=due, wakes=F("wakes") + 1)
        except Exception:
            # Unrecorded wake-ups cost at most one extra message per item.
            log.warning("work.wake_record_failed", exc_info=True)
    return len(sent)


# --- draining: the first wake-up of new items, coalesced per queue -------------------------
#
# Redis keys next to the broker's, as the relay's wake-ups: "pending" says items were
# committed since a drain of the queue last looked; a "slot" key says a drain task holds
# that slot (queued or running) and will look again. Only slot 0 is taken by a wake-up;
# a drain that runs out of time with items left also starts one in the next slot, up to
# WORK_DRAIN_PARALLEL, so a backlog is worked off by several processes.

WORK_DRAIN_TASK = "jobs.work_drain"
# A slot whose drain died (killed worker, purged queue) is free again after this; its
# items are still pending and the sweep wakes them meanwhile.
DRAIN_SLOT_TTL_MS = 10_000


def drain_pending_key(queue: str) -> str:
    return f"agentplatform:work:pending:{queue}"


def drain_slot_key(queue: str, slot: int) -> str:
    return f"agentplatform:work:drain:{queue}:{slot}"


def work_wake_new_on_commit(queue: str) -> None:
    """On commit, wake the drain of ``queue`` for an item created in this transaction."""
    transaction.on_commit(lambda: work_wake_new(queue))


def work_wake_new(*queues: str) -> int:
    """Wake the drains of ``queues`` for items created just now; how many tasks were sent.

    A request that creates an item pays one Redis round trip instead of a broker
    message, and one drain task runs any number of items committed meanwhile. Without
    the coalescing keys (Redis unreachable) a drain task is sent anyway.
    Like a lost message, a refused send leaves the items pending for the sweep, which
    measures their wait from ``created_at``.
    """
    idle = list(queues)
    try:
        client = _coalescing_client()
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            pipe.set(drain_pending_key(queue), 1, px=DRAIN_SLOT_TTL_MS)
            pipe.set(drain_slot_key(queue, 0), 1, nx=True, px=DRAIN_SLOT_TTL_MS)
        taken = pipe.execute()[1::2]
        idle = [queue for queue, took in zip(queues, taken, strict=True) if took]
    except Exception:
        log.warning("work.coalesce_failed", queues=list(queues), exc_info=True)
        client = None
    return sum(drain_send(queue, 0, client) for queue in idle)


def work_wake_reset() -> None:
    """Forget the drains' wake-up keys (after purging the queues: no drain is queued)."""
    with contextlib.suppress(Exception):
        client = _coalescing_client()
        keys = list(client.scan_iter(match="agentplatform:work:*", count=1000))
        if keys:
            client.delete(*keys)


def drain_send(queue: str, slot: int, client: Any) -> bool:
    from celery import current_app

    try:
        current_app.send_task(WORK_DRAIN_TASK, args=(queue, slot), queue=queue)
        return True
    except Exception:
        log.warning("work.wake_failed", queue=queue, drain_slot=slot)
        if client is not None:
            # The slot holds no task: the next wake-up may send one.
            with contextlib.suppress(Exception):
                client.delete(drain_slot_key(queue, slot))
        return False


def _rewake_after(wakes: int) -> float:
    return float(
        min(
            settings.WORK_REWAKE_MAX_SECONDS,
            settings.WORK_REWAKE_SECONDS * (2 ** max(0, wakes - 1)),
        )
    )


@dataclass
class SweepReport:
    woken: int = 0
    overdue: int = 0
    skipped: bool = False


def work_sweep(*, limit: int | None = None) -> SweepReport:
    """Wake pending items that are due, not leased and whose last wake-up went unanswered.

    One sweep at a time (advisory lock); at most ``limit`` wake-ups per tick, oldest due
    first. An item woken at ``t`` is not woken again before ``t + WORK_REWAKE_SECONDS``
    (doubling per unanswered wake-up), so a backlog the workers are still draining gets
    no second message per item, and a lost message costs a bounded delay.
    """
    report = SweepReport()
    limit = limit or settings.WORK_SWEEP_LIMIT
    now = timezone.now()
    base = timedelta(seconds=settings.WORK_REWAKE_SECONDS)
    # The lock covers the sends and their woken_at: a second sweep meanwhile skips
    # instead of re-sending the same items.
    with sweep_lock("work") as held:
        if not held:
            report.skipped = True
            return report
        # Coarse filter in SQL (the smallest re-wake interval); exact backoff per row below.
        candidates = list(
            WorkItem.objects.filter(status=WorkItem.Status.PENDING, due_at__lte=now)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .filter(Q(woken_at__isnull=True) | Q(woken_at__lt=now - base))
            .order_by("due_at")
            .values_list("pk", "queue", "woken_at", "wakes", "created_at")[: limit * 4]
        )
        due: list[tuple[int, str]] = []
        for pk, queue, woken_at, wakes, created_at in candidates:
            since = woken_at or created_at
            if now - since >= timedelta(seconds=_rewake_after(wakes)):
                due.append((pk, queue))
            if len(due) >= limit:
                break
        report.overdue = len(due)
        if due:
            report.woken = work_wake(due)
    if due:
        log.warning("work.swept", woken=report.woken, overdue=report.overdue)
    return report


def work_wake_key(*, kind: str, key: str) -> int:
    """Wake the item of ``kind`` and ``key`` if it is still pending; how many were sent."""
    pairs = list(
        WorkItem.objects.filter(kind=kind, key=key, status=WorkItem.Status.PENDING).values_list(
            "pk", "queue"
        )
    )
    return work_wake(pairs) if pairs else 0


def work_requeue(letter: DeadLetter) -> bool:
    """Reopen the work item behind a dead letter (inside the requeue's transaction)."""
    if not letter.task_id.startswith("work:"):
        return False
    item = WorkItem.objects.select_for_update().filter(pk=int(letter.task_id[5:])).first()
    if item is None:
        return False
    _reopen(item)
    work_wake_on_commit([item])
    return True


def work_overdue_count(*, now: datetime | None = None) -> int:
    """Pending items due and not leased (a gauge of what the workers have not reached)."""
    now = now or timezone.now()
    return (
        WorkItem.objects.filter(status=WorkItem.Status.PENDING, due_at__lte=now)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .count()
    )
