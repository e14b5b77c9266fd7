"""Celery entry points for delivery and the safety-net sweeps run by beat.

Each task loads by id and calls a service; only the retry policy lives here.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from jobs import relay, retention, work_execution
from jobs import work as work_items
from jobs.durable import DurableTask


@shared_task(
    name=relay.OUTBOX_RELAY, base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def outbox_relay() -> int:
    """Drain the outbox up to the rows committed when it caught up; if commits came
    meanwhile, look again after the coalescing window (``relay_wake_done``); if a
    partition is backing off, wake again when it is due."""
    relay.relay_wake_taken()
    more = False
    try:
        report = relay.outbox_drain(max_seconds=relay.RELAY_DRAIN_SECONDS, caught_up=True)
        more = report.more
    finally:
        relay.relay_wake_done(more=more)
    if report.retry_at is not None:
        delay = max(0.0, (report.retry_at - timezone.now()).total_seconds())
        relay.relay_wake(countdown=delay + 0.05)
    return report.published


@shared_task(name="jobs.work", base=DurableTask, ignore_result=True, reject_on_worker_lost=False)
def work(item_id: int) -> str:
    """Run one work item. Only a wake-up: the row says whether anything is left to do.

    A worker that dies mid-item leaves its lease to expire; the sweep wakes the item
    again and counts the death (poison detection), so the message is not requeued.
    """
    return work_execution.work_execute(item_id=item_id)


@shared_task(
    name="jobs.work_drain", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def work_drain(queue: str, slot: int = 0) -> int:
    """Run the queue's pending items, as many as fit in ``WORK_DRAIN_SECONDS``.

    Only a wake-up, like ``jobs.work``: a drain that dies leaves its claimed item's lease
    to expire and the others pending, and its slot frees itself.
    """
    return work_execution.work_drain(queue=queue, slot=slot).done


@shared_task(
    name="jobs.work_sweep", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def work_sweep() -> int:
    return work_items.work_sweep().woken


@shared_task(
    name="jobs.retention_sweep", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def retention_sweep() -> int:
    """Delete delivery history past its retention; the next tick goes on where it ran out
    of time."""
    return sum(retention.retention_sweep().deleted.values())
