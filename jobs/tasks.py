"""Celery entry points for delivery and the safety-net sweeps run by beat.

Each task loads by id and calls a service; only the retry policy lives here.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from jobs.backoff import backoff_delay
from jobs.durable import DurableTask


@shared_task(name="jobs.outbox_relay", base=DurableTask, ignore_result=True)
def outbox_relay() -> int:
    """Drain the outbox; if a partition is backing off, wake again when it is due."""
    from django.utils import timezone

    from jobs.relay import outbox_drain, relay_wake, relay_wake_done, relay_wake_taken

    relay_wake_taken()
    try:
        report = outbox_drain()
    finally:
        relay_wake_done()
    if report.retry_at is not None:
        delay = max(0.0, (report.retry_at - timezone.now()).total_seconds())
        relay_wake(countdown=delay + 0.05)
    return report.published


@shared_task(
    name="jobs.event_consume", base=DurableTask, bind=True, ignore_result=True, max_retries=None
)
def event_consume(self: DurableTask, consumer: str, event_id: str) -> str:
    """One in-app consumer handles one event (once, however often this message comes)."""
    from jobs.consumers import PermanentConsumerError
    from jobs.consumers import event_consume as consume

    try:
        return consume(consumer=consumer, event_id=event_id)
    except PermanentConsumerError:
        raise
    except Exception as exc:
        retries = self.request.retries
        if retries >= settings.EVENT_CONSUMER_MAX_RETRIES:
            raise
        raise self.retry(
            exc=exc,
            countdown=backoff_delay(
                attempt=retries + 1,
                base=settings.EVENT_CONSUMER_RETRY_BASE_SECONDS,
                cap=600.0,
            ),
        ) from exc


@shared_task(
    name="jobs.subscription_deliver",
    base=DurableTask,
    bind=True,
    ignore_result=True,
    max_retries=None,
)
def subscription_deliver(self: DurableTask, subscription_id: int, event_id: str) -> str:
    """POST one event to one HTTP subscription; retried with backoff, then dead-lettered."""
    from jobs.consumers import PermanentConsumerError
    from jobs.subscriptions import subscription_deliver as deliver

    try:
        return deliver(subscription_id=subscription_id, event_id=event_id)
    except PermanentConsumerError:
        raise
    except Exception as exc:
        retries = self.request.retries
        if retries + 1 >= settings.SUBSCRIPTION_MAX_ATTEMPTS:
            raise
        raise self.retry(
            exc=exc,
            countdown=backoff_delay(
                attempt=retries + 1,
                base=settings.SUBSCRIPTION_RETRY_BASE_SECONDS,
                cap=3600.0,
            ),
        ) from exc
