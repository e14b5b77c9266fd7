"""Executing work items: claim one, run its kind's handler, record the outcome.

A worker claims an item's row with a lease before calling the handler (``work_execute``
for one woken item, ``work_drain`` for a queue's pending items one after another). A
claim that finds an expired lease knows the previous worker died holding it: after
``WORK_POISON_CRASHES`` such deaths the item is dead-lettered as poison. Ordinary
failures retry with backoff until the kind's ``max_attempts``, then become dead letters;
a ``WorkDeferred`` comes back when the wait is over without spending an attempt.
Producing and waking items is ``jobs.work``'s.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import metrics, sql, tracing
from jobs.backoff import backoff_delay
from jobs.coalescing import coalescing_client as _coalescing_client
from jobs.dead_letters import dead_letter_record
from jobs.logs import log
from jobs.models import WorkItem
from jobs.work import (
    DRAIN_SLOT_TTL_MS,
    PermanentWorkError,
    WorkDeferred,
    WorkKind,
    drain_pending_key,
    drain_send,
    drain_slot_key,
    work_kind,
    work_wake,
    work_wake_new,
)


def _claim_next(queue: str) -> WorkItem | None:
    """The oldest due item of ``queue`` no one holds, leased (``jobs.sql.WORK_CLAIM_NEXT``)."""
    now = timezone.now()
    params = [
        now + timedelta(seconds=settings.WORK_LEASE_SECONDS),
        uuid.uuid4().hex,
        queue,
        now,
        now,
        settings.WORK_POISON_CRASHES,
    ]
    return next(iter(WorkItem.objects.raw(sql.WORK_CLAIM_NEXT, params)), None)


@dataclass
class DrainReport:
    done: int = 0
    more: bool = False
    outcomes: dict[str, int] = field(default_factory=dict)


def work_drain(*, queue: str, slot: int = 0, seconds: float | None = None) -> DrainReport:
    """Claim and run the queue's pending items one after another, for up to ``seconds``.

    Each item is claimed, run and finished exactly as ``work_execute`` does it; a drain
    is only a cheaper wake-up. Ends when no item is left (then looks again if items were
    committed meanwhile) or when its time is up (then a fresh task goes on in this slot
    and, if free, in the next one).
    """
    budget = settings.WORK_DRAIN_SECONDS if seconds is None else seconds
    client = _coalescing_client()
    with contextlib.suppress(Exception):
        client.delete(drain_pending_key(queue))  # what was committed until now is ours
    report = DrainReport()
    started = refreshed = time.monotonic()
    try:
        while True:
            if time.monotonic() - started >= budget:
                report.more = True
                break
            item = _claim_next(queue)
            if item is None:
                break
            outcome = _run(item)
            report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
            report.done += 1
            if client is not None and time.monotonic() - refreshed > 1.0:
                refreshed = time.monotonic()
                with contextlib.suppress(Exception):
                    client.pexpire(drain_slot_key(queue, slot), DRAIN_SLOT_TTL_MS)
    finally:
        _drain_done(queue, slot, client, more=report.more)
    return report


def _drain_done(queue: str, slot: int, client: Any, *, more: bool) -> None:
    if client is None:
        if more:
            drain_send(queue, slot, None)
        return
    try:
        key = drain_slot_key(queue, slot)
        if more:
            client.pexpire(key, DRAIN_SLOT_TTL_MS)
            drain_send(queue, slot, client)
            helper = slot + 1
            if helper < settings.WORK_DRAIN_PARALLEL and client.set(
                drain_slot_key(queue, helper), 1, nx=True, px=DRAIN_SLOT_TTL_MS
            ):
                drain_send(queue, helper, client)
            return
        client.delete(key)
        # An item committed after this drain's last claim, whose wake-up found the slot
        # still held, sent nothing: it is this drain's to answer.
        if client.get(drain_pending_key(queue)):
            work_wake_new(queue)
    except Exception:  # the sweep wakes whatever this misses
        log.warning("work.coalesce_failed", queue=queue, exc_info=True)


def _claim(item_id: int) -> tuple[WorkItem | None, str]:
    """Lease the item for this worker; (item, "claimed") or (None, why not): missing,
    done, in flight, early or poison, told apart under the row lock."""
    now = timezone.now()
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().filter(pk=item_id).first()
        if item is None:
            return None, "missing"
        if item.status != WorkItem.Status.PENDING:
            return None, item.status
        if item.lease_until is not None and item.lease_until > now:
            return None, "in_flight"
        if item.due_at > now:
            return None, "early"
        crashes = item.crashes
        if item.lease_until is not None:
            # The previous claim neither finished nor failed: its worker died with it.
            crashes += 1
        if crashes >= settings.WORK_POISON_CRASHES:
            WorkItem.objects.filter(pk=item.pk).update(
                status=WorkItem.Status.DEAD,
                crashes=crashes,
                lease_until=None,
                claim="",
                finished_at=now,
                last_error=f"killed its worker {crashes} times",
            )
            item.crashes = crashes
            _dead_letter(item, exception=f"poison: killed its worker {crashes} times", tb="")
            return None, "poison"
        token = uuid.uuid4().hex
        WorkItem.objects.filter(pk=item.pk).update(
            lease_until=now + timedelta(seconds=settings.WORK_LEASE_SECONDS),
            claim=token,
            crashes=crashes,
            attempts=F("attempts") + 1,
            wakes=0,
        )
        item.claim, item.crashes, item.attempts, item.wakes = token, crashes, item.attempts + 1, 0
    return item, "claimed"


def work_execute(*, item_id: int) -> str:
    """Run one item's handler if it is pending and not in flight; its outcome."""
    item, why = _claim(item_id)
    if item is None:
        return why
    return _run(item)


def _run(item: WorkItem) -> str:
    """Run a claimed item's handler and record its outcome."""
    spec = work_kind(item.kind)
    # The item's own trace, not the one of whichever sender (relay, sweep) woke it.
    tracing.trace_activate(
        tracing.traceparent_child(item.traceparent) or tracing.traceparent_current()
    )
    structlog.contextvars.bind_contextvars(work_kind=item.kind, work_key=item.key)
    try:
        if not (item.crashes and spec.split is not None and spec.split(**item.args)):
            spec.handler(**item.args)
    except Exception as exc:
        return _failed(item, spec, exc)
    WorkItem.objects.filter(pk=item.pk, claim=item.claim).update(
        status=WorkItem.Status.DONE,
        lease_until=None,
        claim="",
        finished_at=timezone.now(),
        last_error="",
    )
    return "done"


def _failed(item: WorkItem, spec: WorkKind, exc: Exception) -> str:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    permanent = isinstance(exc, (PermanentWorkError, *spec.permanent))
    now = timezone.now()
    deferral = exc if isinstance(exc, WorkDeferred) else None
    # A deferral gives back the attempt it spent, up to the kind's max_deferrals.
    given_back = deferral if deferral is not None and item.deferrals < spec.max_deferrals else None
    if given_back is None and (permanent or item.attempts >= spec.max_attempts):
        with transaction.atomic():
            updated = WorkItem.objects.filter(pk=item.pk, claim=item.claim).update(
                status=WorkItem.Status.DEAD,
                lease_until=None,
                claim="",
                finished_at=now,
                last_error=error,
            )
            if updated:
                _dead_letter(item, exception=error, tb=traceback.format_exc())
        log.error("work.dead", kind=item.kind, key=item.key, error=error[:300])
        return "dead"
    counts: dict[str, Any] = {}
    if given_back is not None:
        delay = given_back.seconds
        counts = {"attempts": F("attempts") - 1, "deferrals": F("deferrals") + 1}
    else:
        delay = backoff_delay(
            attempt=item.attempts, base=spec.retry_base_seconds, cap=spec.retry_max_seconds
        )
        if deferral is not None:
            delay = max(delay, deferral.seconds)
    WorkItem.objects.filter(pk=item.pk, claim=item.claim).update(
        lease_until=None,
        claim="",
        due_at=now + timedelta(seconds=delay),
        last_error=error,
        **counts,
    )
    if given_back is not None:
        log.info("work.deferred", kind=item.kind, key=item.key, delay=round(delay, 2))
    else:
        log.warning("work.retry", kind=item.kind, key=item.key, delay=round(delay, 2), error=error)
    work_wake([(item.pk, item.queue)], countdown=delay)
    return "retry" if given_back is None else "deferred"


def _dead_letter(item: WorkItem, *, exception: str, tb: str) -> None:
    metrics.dead_letters.labels(item.kind).inc()
    dead_letter_record(
        task_name=item.kind,
        task_id=work_letter_id(item.pk),
        args=[],
        kwargs=dict(item.args),
        queue=item.queue,
        exception=exception,
        traceback=tb,
        attempts=item.attempts,
        recoveries=item.crashes,
    )


def work_letter_id(item_id: int) -> str:
    """The dead letter's task id for a work item: a requeue reopens the same row."""
    return f"work:{item_id}"
