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

    from jobs.relay import outbox_drain, relay_wake

    report = outbox_drain()
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


@shared_task(name="jobs.zombies_reap", base=DurableTask, ignore_result=True)
def zombies_reap() -> dict[str, int]:
    from jobs.reaper import zombies_reap as reap

    report = reap()
    return {
        "recovered": report.recovered,
        "failed": report.failed,
        "redispatched": report.redispatched,
    }


@shared_task(name="jobs.approvals_expire", base=DurableTask, ignore_result=True)
def approvals_expire() -> int:
    from runs.services import approvals_expire as expire

    # Safe to run twice at once: each approval is expired under its row lock.
    return expire()


@shared_task(name="jobs.tasks_readmit", base=DurableTask, ignore_result=True)
def tasks_readmit() -> int:
    from runs.services import tasks_readmit as readmit

    return readmit()


@shared_task(name="jobs.sandboxes_sweep", base=DurableTask, ignore_result=True)
def sandboxes_sweep() -> int:
    from runs.agent.sandbox import sandbox_orphans_sweep
    from runs.models import Run
    from runs.state import ACTIVE

    active = {str(pk) for pk in Run.objects.filter(status__in=ACTIVE).values_list("pk", flat=True)}
    return len(sandbox_orphans_sweep(active_run_ids=active))
