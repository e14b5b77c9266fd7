"""Wake-up messages for runs. They carry ids and a step number, never state.

This module only publishes: it names the step task (``RUN_STEP``, defined in
``runs.tasks``, which ``RunsConfig.ready`` registers) and never imports the tasks, which
sit above everything they call (docs/design.md §2).
"""

from __future__ import annotations

import uuid

from celery import current_app
from django.db import transaction

from jobs.workers import queues_served
from runs import fairness
from runs.logs import log
from runs.models import Run

# The Celery name of the task that takes a run's step (``runs.tasks.run_step``).
RUN_STEP = "runs.step"

QUEUE_FOR_STATUS: dict[str, str] = {Run.Status.VERIFYING: "verify"}


def queue_for(status: str) -> str:
    """The queue whose workers take a step of a run in ``status``."""
    return QUEUE_FOR_STATUS.get(status, "agent")


def served_here(*, status: str, source: str) -> bool:
    """Whether a worker that took a step of a run in ``source`` may take the next one, in
    ``status``, itself: it is on the same queue, or on one this worker consumes too (a
    worker deployed for both agent and verify steps sends itself no wake-up between
    them)."""
    queue = queue_for(status)
    return queue == queue_for(source) or queue in queues_served()


def run_wake(*, run_id: uuid.UUID | str, step_no: int, status: str = "") -> None:
    """Send the message that makes a worker take step ``step_no`` of the run, at the
    broker priority of its task's effective priority and its workspace's share now."""
    priority = fairness.step_priority(run_id)
    # kombu's Redis transport keeps one list per priority step and serves the lower
    # first (CELERY_BROKER_TRANSPORT_OPTIONS["priority_steps"], docs/design.md Decisions).
    current_app.tasks[RUN_STEP].apply_async(
        args=(str(run_id), step_no), queue=queue_for(status), priority=priority
    )


def run_wake_on_commit(*, run_id: uuid.UUID | str, step_no: int, status: str = "") -> None:
    """Dispatch once the state that needs the step is committed (never before).

    A refused send is logged, not raised: the state is committed, so the caller (an API
    request, a webhook) must answer with it rather than fail, and the stall sweep
    re-sends the wake-up of a run nobody picked up.
    """

    def wake() -> None:
        try:
            run_wake(run_id=run_id, step_no=step_no, status=status)
        except Exception:
            log.warning("run.wake_failed", run_id=str(run_id), step_no=step_no, exc_info=True)

    transaction.on_commit(wake)
