"""What a dead letter means to runs: a timeline event, and a run step that cannot finish."""

from __future__ import annotations

from django.db import transaction

from jobs.models import DeadLetter
from runs.ending import run_end_unleased
from runs.models import Run
from runs.timeline import PendingEvent, events_record, system_event_record


def dead_letter_announce(letter: DeadLetter) -> None:
    """Record ``agent.job.dead_lettered``; a dead-lettered step also ends its run failed.

    Called by ``jobs`` inside the transaction that records the letter.
    """
    run = None
    if letter.task_name == "runs.step" and letter.args:
        run = Run.objects.select_related("task").filter(pk=letter.args[0]).first()
    if run is not None:
        letter.recoveries = max(letter.recoveries, run.recoveries)
        letter.workspace_id = run.task.workspace_id
        letter.save(update_fields=["recoveries", "workspace_id"])
    data = {
        "dead_letter_id": str(letter.id),
        "task_name": letter.task_name,
        "exception": letter.exception[:500],
        "attempts": letter.attempts,
        "recoveries": letter.recoveries,
    }
    if run is None:
        system_event_record(
            type="agent.job.dead_lettered",
            data=data,
            partition_key=f"job:{letter.task_name}",
            workspace_id=letter.workspace_id,
        )
        return
    events_record(task=run.task, run=run, events=[PendingEvent("agent.job.dead_lettered", data)])
    run_id, detail = run.id, letter.exception
    # So nothing waits on a step that will never run again.
    transaction.on_commit(
        lambda: run_end_unleased(
            run_id=run_id, target=Run.Status.FAILED, reason="step_error", detail=detail
        )
    )
