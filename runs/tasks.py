"""Celery entry points for runs: load by id, call the engine. Nothing else lives here."""

from __future__ import annotations

from celery import shared_task

from jobs.durable import DurableTask
from runs import engine


@shared_task(
    name="runs.step",
    base=DurableTask,
    bind=True,
    autoretry_for=(Exception,),
    dont_autoretry_for=(engine.StepFailed,),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=5,
)
def run_step(self: DurableTask, run_id: str, step_no: int) -> str:
    """Advance a run by one step if this message is still the current one."""
    return engine.step_execute(run_id=run_id, step_no=step_no)
