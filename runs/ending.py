"""A run's end (docs/design.md §4, §7): its closing facts, its task's status, and the
work left after it, written in the transaction that ends the run."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from jobs import work, work_execution
from runs.agent.budget import run_working_seconds
from runs.agent.sandbox import run_workdirs_remove
from runs.lease import Lease
from runs.logs import log
from runs.models import PullRequest, Run, Task
from runs.protocol import Outcome, StepContext
from runs.services.commands import approvals_void
from runs.services.followups import after_terminal_needed_sql
from runs.state import TERMINAL, transition_check
from runs.timeline import PendingEvent, events_record

S = Run.Status

TERMINAL_RUN_EVENT: dict[str, str] = {
    S.COMPLETED: "agent.run.completed",
    S.FAILED: "agent.run.failed",
    S.CANCELLED: "agent.run.cancelled",
    S.TIMED_OUT: "agent.run.timed_out",
}
TERMINAL_TASK_STATUS: dict[str, str] = {
    S.COMPLETED: Task.Status.COMPLETED,
    S.FAILED: Task.Status.FAILED,
    S.CANCELLED: Task.Status.CANCELLED,
    S.TIMED_OUT: Task.Status.FAILED,
}
TERMINAL_TASK_EVENT: dict[str, str] = {
    S.COMPLETED: "agent.task.completed",
    S.FAILED: "agent.task.failed",
    S.CANCELLED: "agent.task.cancelled",
    S.TIMED_OUT: "agent.task.failed",
}


def terminal_events(
    ctx: StepContext, target: str, outcome: Outcome
) -> tuple[list[PendingEvent], int | None]:
    """The run's and the task's closing facts, and the task's status, in the same commit;
    with the id of the after-terminal work item recorded with them (None: no such work).

    Pending approvals of the run are voided here, so nobody can approve (or expire)
    a patch of a run that is over.
    """
    task = ctx.task
    run = ctx.run
    approvals_void(run_id=run.pk)
    delivered = target != S.COMPLETED and _delivered_before(task, run)
    closing, task_fields = _terminal_closing(ctx, target, outcome, delivered_before=delivered)
    Task.objects.filter(pk=task.pk).update(**task_fields)
    # After the task's row is written: the item's condition reads that row.
    with connection.cursor() as cursor:
        cursor.execute(*_after_terminal_insert_sql(task, run))
        row = cursor.fetchone()
    return closing, None if row is None else int(row[0])


def _after_terminal_insert_sql(task: Task, run: Run) -> tuple[str, list[Any]]:
    """The after-terminal work item of a run's end, recorded only when there is such work
    (``after_terminal_needed_sql``: batched feedback, a deferred task), returning its id.

    Batched feedback and deferred tasks wait for this: a row, not a callback, so a crash
    or a refused broker right after the commit cannot strand them. No wake-up: the
    committing worker runs the item right after the commit (``_after_terminal``), and a
    message would only be a second, idle claim of it, one per run, queued behind every
    other wake-up of the events queue. If that worker dies first, the work sweep wakes
    the item; deferred tasks are also re-admitted by their own schedule. A run ends once
    (its end is fenced in its transaction): its item is new.
    """
    return work.work_insert_when(
        kind=AFTER_TERMINAL,
        key=str(run.pk),
        args={"run_id": str(run.pk)},
        when=after_terminal_needed_sql(task=task),
    )


def _terminal_closing(
    ctx: StepContext, target: str, outcome: Outcome, *, delivered_before: bool
) -> tuple[list[PendingEvent], dict[str, Any]]:
    """The closing events of a run ending in ``target`` and the task's fields after it.

    ``delivered_before``: an earlier run of the task completed and its pull request is
    still open (``_delivered_before``).
    """
    task, run = ctx.task, ctx.run
    data: dict[str, Any] = {"run_no": run.run_no}
    if target != S.COMPLETED:
        data.update(reason=outcome.reason or target, detail=outcome.detail[:500])
    usage = dict(task.usage or {})
    usage["wall_clock_seconds"] = float(usage.get("wall_clock_seconds", 0)) + (
        run_working_seconds(run)
    )
    if delivered_before:
        # A retry of a task that already delivered: its failure ends this run, not the
        # task, whose pull request is still open and still what it delivered.
        return [PendingEvent(TERMINAL_RUN_EVENT[target], data)], {
            "status": Task.Status.COMPLETED,
            "status_reason": f"run {run.run_no} {target}: {outcome.reason or target}",
            "usage": usage,
            "updated_at": timezone.now(),
        }
    return [
        PendingEvent(TERMINAL_RUN_EVENT[target], data),
        PendingEvent(TERMINAL_TASK_EVENT[target], data),
    ], {
        "status": TERMINAL_TASK_STATUS[target],
        "status_reason": outcome.reason if target != S.COMPLETED else "",
        "usage": usage,
        "updated_at": timezone.now(),
    }


def _delivered_before(task: Task, run: Run) -> bool:
    """Whether an earlier run of the task completed and its pull request is still open."""
    return (
        Run.objects.filter(task=task, status=S.COMPLETED, run_no__lt=run.run_no).exists()
        and PullRequest.objects.filter(task=task, state=PullRequest.State.OPEN).exists()
    )


def _task_status_followed(*, source: str, target: str | None) -> str | None:
    """The task's status when a step of its run moves from ``source`` to ``target``
    (None: the task's status stays): it says when it waits for a person, and when it
    runs again."""
    if target is None or target in TERMINAL:
        return None
    if target == S.AWAITING_APPROVAL:
        return str(Task.Status.AWAITING_APPROVAL)
    if target == S.AWAITING_INPUT:
        return str(Task.Status.AWAITING_INPUT)
    if source in (S.AWAITING_APPROVAL, S.AWAITING_INPUT, S.QUEUED):
        return str(Task.Status.RUNNING)
    return None


def task_status_follow(task: Task, *, source: str, target: str) -> None:
    status = _task_status_followed(source=source, target=target)
    if status is not None:
        Task.objects.filter(pk=task.pk).exclude(status=status).update(
            status=status, updated_at=timezone.now()
        )


AFTER_TERMINAL = "run.after_terminal"


def after_terminal(run_id: uuid.UUID, item_id: int | None) -> None:
    """Clean the sandbox, then run the after-terminal work item now, if the run's end
    recorded one (it was recorded without a wake-up). If running it here raised (the
    database went away meanwhile),
    its wake-up is sent, so a worker retries it at once rather than the work sweep
    ``WORK_REWAKE_SECONDS`` later; a failure of the item's own handler is retried by
    the item's backoff."""
    try:
        run_workdirs_remove(run_id)
    except Exception:
        log.exception("run.workdirs_remove_failed", run_id=str(run_id))
    if item_id is None:
        return
    try:
        work_execution.work_execute(item_id=item_id)
    except Exception:
        log.exception("run.after_terminal_failed", run_id=str(run_id))
        try:
            work.work_wake_key(kind=AFTER_TERMINAL, key=str(run_id))
        except Exception:
            log.warning("run.after_terminal_wake_failed", run_id=str(run_id), exc_info=True)


def run_end_unleased(
    *,
    run_id: uuid.UUID | str,
    target: str,
    reason: str,
    detail: str = "",
    events: list[PendingEvent] | None = None,
) -> bool:
    """End a run that no worker holds (reaper, cancelling an idle run). False if raced."""
    now = timezone.now()
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .select_related("task__repository", "task__workspace")
            .filter(pk=run_id)
            .first()
        )
        if run is None or run.status in TERMINAL:
            return False
        if run.lease_until is not None and run.lease_until >= now:
            return False
        transition_check(run.status, target)
        source = run.status
        Run.objects.filter(pk=run.pk).update(
            status=target,
            status_changed_at=now,
            finished_at=now,
            lease_owner="",
            lease_until=None,
            step_no=F("step_no") + 1,
            failure_reason=reason if target != S.COMPLETED else "",
            failure_detail=detail[:5000],
        )
        ctx = StepContext(run, Lease(run.id, "", run.attempt, run.step_no))
        pending = list(events or [])
        pending.append(
            PendingEvent(
                "agent.run.status.changed", {"from": source, "to": target, "reason": reason}
            )
        )
        closing, after = terminal_events(
            ctx, target, Outcome(to=target, reason=reason, detail=detail)
        )
        pending.extend(closing)
        events_record(task=run.task, run=run, events=pending)
        transaction.on_commit(lambda: after_terminal(run.id, after))
    return True
