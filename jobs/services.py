"""Dead letters: record, requeue, discard."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.logs import log
from jobs.models import DeadLetter


def dead_letter_record(
    *,
    task_name: str,
    task_id: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str,
    exception: str,
    traceback: str,
    attempts: int,
    recoveries: int = 0,
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
        letter.recoveries = recoveries
        run = None
        if task_name == "runs.step" and args:
            run = Run.objects.select_related("task").filter(pk=args[0]).first()
            if run is not None:
                letter.recoveries = max(recoveries, run.recoveries)
        data = {
            "dead_letter_id": str(letter.id),
            "task_name": task_name,
            "exception": exception[:500],
            "attempts": attempts,
            "recoveries": letter.recoveries,
        }
        if run is not None:
            letter.workspace_id = run.task.workspace_id
            letter.save()
            events_record(
                task=run.task, run=run, events=[PendingEvent("agent.job.dead_lettered", data)]
            )
        else:
            letter.workspace_id = _workspace_of_event_job(task_name, args)
            letter.save()
            system_event_record(
                type="agent.job.dead_lettered",
                data=data,
                partition_key=f"job:{task_name}",
                workspace_id=letter.workspace_id,
            )
    log.error("job.dead_lettered", task=task_name, task_id=task_id, exception=exception[:300])
    if run is not None:
        from runs.engine import run_end_unleased

        run_end_unleased(
            run_id=run.id, target=Run.Status.FAILED, reason="step_error", detail=exception
        )
    return letter


def _workspace_of_event_job(task_name: str, args: list[Any]) -> int | None:
    """The workspace of the event a consumer or subscription job was handling."""
    from jobs.models import OutboxEvent

    if task_name not in ("jobs.event_consume", "jobs.subscription_deliver") or len(args) < 2:
        return None
    payload = (
        OutboxEvent.objects.filter(event_id=str(args[1])).values_list("payload", flat=True).first()
    )
    workspace = (payload or {}).get("workspaceid")
    return int(workspace) if workspace else None


def dead_letter_requeue(*, letter: DeadLetter, by: str) -> bool:
    """Send the job again with its original arguments; False if it is not open.

    The job is sent on commit, so a rolled-back requeue sends nothing; jobs are
    idempotent (receipts, step numbers), so requeueing one that partly ran is safe.
    """
    from agentplatform.celery import app

    with transaction.atomic():
        updated = DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
            status=DeadLetter.Status.REQUEUED, resolved_at=timezone.now(), resolved_by=by
        )
        if updated:
            transaction.on_commit(
                lambda: app.send_task(
                    letter.task_name,
                    args=letter.args,
                    kwargs=letter.kwargs,
                    queue=letter.queue or None,
                )
            )
    return bool(updated)


def dead_letter_discard(*, letter: DeadLetter, by: str) -> bool:
    """Close the letter without running the job again; False if it is not open."""
    return bool(
        DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
            status=DeadLetter.Status.DISCARDED, resolved_at=timezone.now(), resolved_by=by
        )
    )
