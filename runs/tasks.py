"""Celery entry points for runs: load by id, call the engine. Nothing else lives here."""

from __future__ import annotations

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import InterfaceError, OperationalError

from jobs.backoff import backoff_delay
from jobs.durable import DurableTask
from runs import engine, reaper, services, waiting
from runs.agent.sandbox import sandbox_orphans_sweep
from runs.dispatch import RUN_STEP
from runs.lease import worker_identity
from runs.models import Run
from runs.protocol import StepFailed
from runs.state import ACTIVE


@shared_task(
    name=RUN_STEP,
    base=DurableTask,
    bind=True,
    # A step's outcome lives in the run row; storing a result would cost a write per
    # step, and a retry would need the database just to record that it is retrying.
    ignore_result=True,
    max_retries=5,
)
def run_step(self: DurableTask, run_id: str, step_no: int, owner: str | None = None) -> str:
    """Advance a run from step ``step_no`` if this message is still the current one.

    The worker may go on with the run's next steps for ``RUN_STEP_SLICE_SECONDS``
    (``engine.step_execute``); a retry names the step that met the error, not the one
    this message was sent for, which is over by then.

    When the database is unreachable or out of connections, that is no fault of the
    step: it is retried (with the same lease owner, so a lease it could not give back
    does not block it) for as long as ``RUN_STEP_DATABASE_RETRIES`` allows, apart from
    the step's own retry budget, instead of ending the run. Any other error is retried
    with exponential backoff (2 s doubling, capped at 120 s, jittered), up to
    ``max_retries`` times.
    """
    owner = owner or worker_identity()
    at = engine.StepSlice(seconds=settings.RUN_STEP_SLICE_SECONDS)
    try:
        return engine.step_execute(
            run_id=run_id, step_no=step_no, owner=owner, slice=at, retry=self.request.retries > 0
        )
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(
            exc=exc,
            args=(run_id, at.step_no),
            kwargs={"owner": owner},
            countdown=backoff_delay(attempt=min(self.request.retries + 1, 6), base=0.5, cap=30.0),
            max_retries=settings.RUN_STEP_DATABASE_RETRIES,
        ) from exc
    except StepFailed:
        raise
    except Exception as exc:
        raise self.retry(
            exc=exc,
            args=(run_id, at.step_no),
            countdown=get_exponential_backoff_interval(
                factor=2, retries=self.request.retries, maximum=120, full_jitter=True
            ),
        ) from exc


@shared_task(
    name="runs.zombies_reap", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def zombies_reap() -> dict[str, int]:
    report = reaper.zombies_reap()
    return {
        "recovered": report.recovered,
        "failed": report.failed,
        "redispatched": report.redispatched,
    }


@shared_task(
    name="runs.approvals_expire", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def approvals_expire() -> int:
    # Safe to run twice at once: each approval is expired under its row lock.
    return services.approvals_expire()


@shared_task(
    name="runs.inputs_expire", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def inputs_expire() -> int:
    # Safe to run twice at once: each question is expired under its run's row lock.
    return waiting.inputs_expire()


@shared_task(
    name="runs.tasks_readmit", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def tasks_readmit() -> int:
    return services.tasks_readmit()


@shared_task(
    name="runs.sandboxes_sweep", base=DurableTask, ignore_result=True, reject_on_worker_lost=False
)
def sandboxes_sweep() -> int:
    active = {str(pk) for pk in Run.objects.filter(status__in=ACTIVE).values_list("pk", flat=True)}
    return len(sandbox_orphans_sweep(active_run_ids=active))
