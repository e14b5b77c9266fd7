"""Dead letters: record, requeue, discard."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.logs import log
from jobs.models import DeadLetter


def dead_letter_record(
    *, task_name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], queue: str,
    exception: str, traceback: str, attempts: int,
) -> DeadLetter:
    """Record a job that exhausted its retries (or failed for good), and say so as an event.

    A run step that dead-letters also ends its run failed, so nothing waits on it.
    """
    from runs.models import Run
    from runs.timeline import PendingEvent, events_record, system_event_record

    now = timezone.now()
    with transaction.atomic():
        letter = DeadLetter.objects.filter(task_id=task_id, status=DeadLetter.Status.OPEN).first()
        if letter is None:
            letter = DeadLetter(task_name=task_name, task_id=task_id, first_failed_at=now)
        letter.args, letter.kwargs, letter.queue = args, kwargs, queue
        letter.exception, letter.traceback = exception[:5000], traceback[-20000:]
        letter.attempts, letter.last_failed_at = attempts, now
        data = {"dead_letter_id": str(letter.id), "task_name": task_name,
                "exception": exception[:500], "attempts": attempts}
        run = None
        if task_name == "runs.step" and args:
            run = Run.objects.select_related("task").filter(pk=args[0]).first()
        if run is not None:
            letter.workspace_id = run.task.workspace_id
            letter.save()
            events_record(task=run.task, run=run,
                          events=[PendingEvent("agent.job.dead_lettered", data)])
        else:
            letter.save()
            system_event_record(type="agent.job.dead_lettered", data=data,
                                partition_key=f"job:{task_name}")
    log.error("job.dead_lettered", task=task_name, task_id=task_id, exception=exception[:300])
    if run is not None:
        from runs.engine import run_end_unleased

        run_end_unleased(run_id=run.id, target=Run.Status.FAILED, reason="step_error",
                         detail=exception)
    return letter


def dead_letter_requeue(*, letter: DeadLetter, by: str) -> bool:
    """Send the job again with its original arguments; False if it is not open."""
    from agentplatform.celery import app

    with transaction.atomic():
        updated = DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
            status=DeadLetter.Status.REQUEUED, resolved_at=timezone.now(), resolved_by=by
        )
        if updated:
            transaction.on_commit(lambda: app.send_task(
                letter.task_name, args=letter.args, kwargs=letter.kwargs,
                queue=letter.queue or None,
            ))
    return bool(updated)


def dead_letter_discard(*, letter: DeadLetter, by: str) -> bool:
    return bool(DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
        status=DeadLetter.Status.DISCARDED, resolved_at=timezone.now(), resolved_by=by
    ))
