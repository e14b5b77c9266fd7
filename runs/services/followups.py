"""What follows a run: retries and follow-up runs of a task, the work after a run's end
(batched feedback, deferred tasks), and the recovery of stalled runs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from jobs.locks import sweep_lock
from runs import dispatch
from runs.logs import log
from runs.models import (
    PullRequest,
    Run,
    Task,
)
from runs.services.admission import _lock_workspace, _run_start, admission_check, tasks_readmit
from runs.services.errors import CommandRefused
from runs.state import ACTIVE, STEPPABLE
from runs.timeline import (
    event_record,
)


def _pull_request_merged(task: Task) -> bool:
    return PullRequest.objects.filter(task=task, state=PullRequest.State.MERGED).exists()


def task_retry(*, task: Task, by: str) -> Run:
    """A new run of the task from scratch; refused while a run is active, after its pull
    request was merged, or when the workspace or repository has no capacity now."""
    with transaction.atomic():
        # Workspace before task: the order admission and re-admission lock in.
        ws = _lock_workspace(task.workspace_id)
        locked = Task.objects.select_for_update().select_related("repository").get(pk=task.pk)
        if locked.runs.filter(status__in=ACTIVE).exists():
            raise CommandRefused("run_active", "the task has an active run")
        if _pull_request_merged(locked):
            raise CommandRefused(
                "pull_request_merged", "the task's pull request was merged; submit a new task"
            )
        refusal = admission_check(workspace=ws, repository=locked.repository)
        if refusal is not None:
            raise CommandRefused("no_capacity", refusal)
        return _run_start(task=locked, actor=by)


def _feedback_defer(task: Task, feedback: str, reason: str) -> None:
    """Keep the feedback for re-admission: the task waits like a deferred submission."""
    Task.objects.filter(pk=task.pk).update(
        pending_feedback=feedback,
        status=Task.Status.DEFERRED,
        status_reason=reason,
        updated_at=timezone.now(),
    )
    event_record(task=task, run=None, type="agent.task.deferred", data={"reason": reason})


def task_followup(*, task: Task, feedback: str, by: str) -> Run | None:
    """A follow-up run with feedback on the same branch and PR.

    If a run is active, the feedback is batched and starts the next follow-up when that
    run ends; if the workspace or repository is at capacity, the task is deferred with
    its feedback and re-admitted like any other. Returns None in both cases. Refused
    after the task's pull request was merged.
    """
    with transaction.atomic():
        ws = _lock_workspace(task.workspace_id)
        locked = Task.objects.select_for_update().select_related("repository").get(pk=task.pk)
        if _pull_request_merged(locked):
            raise CommandRefused(
                "pull_request_merged", "the task's pull request was merged; submit a new task"
            )
        joined = "\n\n".join(filter(None, [locked.pending_feedback, feedback]))
        if locked.runs.filter(status__in=ACTIVE).exists():
            Task.objects.filter(pk=task.pk).update(pending_feedback=joined)
            return None
        refusal = admission_check(workspace=ws, repository=locked.repository)
        if refusal is not None:
            _feedback_defer(locked, joined, refusal)
            return None
        Task.objects.filter(pk=task.pk).update(pending_feedback="")
        return _run_start(task=locked, feedback=joined, actor=by)


def after_terminal_needed_sql(*, task: Task) -> tuple[str, list[Any]]:
    """A condition (SQL, parameters): the end of a run of ``task`` leaves work for
    ``run_after_terminal``, batched feedback on the task or a deferred task in its
    workspace. The run's end records its after-terminal item only when this holds,
    read in the ending transaction after it wrote the task's row: feedback batched by
    ``task_followup`` (which writes that row under its lock, having seen the run active)
    committed before that write and is seen here, or comes after this commit and sees
    the run ended. A task deferred after this read is let in by the re-admission
    schedule, as one deferred after ``run_after_terminal``'s own read is.
    """
    table = connection.ops.quote_name(Task._meta.db_table)
    # The status is written into the statement, as the task_deferred_queue index's
    # condition says it: as a parameter of a prepared statement's generic plan it
    # matched no partial index, and the check read every task (a scan of 1,000,000
    # tasks at every run's end).
    deferred = str(Task.Status.DEFERRED)  # our enum value
    return (
        f"(EXISTS (SELECT 1 FROM {table} WHERE id = %s AND pending_feedback <> '')"  # noqa: S608 - names are ours
        f" OR EXISTS (SELECT 1 FROM {table} WHERE workspace_id = %s AND status = '{deferred}'))",
        [Task._meta.pk.get_db_prep_value(task.pk, connection), task.workspace_id],
    )


def run_after_terminal(*, run_id: uuid.UUID | str) -> None:
    """After a run ends: start a batched follow-up (if admitted), then let deferred
    tasks in. Runs as a work item recorded with the run's end (when
    ``after_terminal_needed_sql`` held then), so it is never lost."""
    run = (
        Run.objects.filter(pk=run_id)
        .annotate(
            deferred=Exists(
                Task.objects.filter(
                    workspace_id=OuterRef("task__workspace_id"), status=Task.Status.DEFERRED
                )
            )
        )
        .values_list("task_id", "task__workspace_id", "task__pending_feedback", "deferred")
        .first()
    )
    if run is None:
        return
    task_id, workspace_id, pending, deferred = run
    # Feedback batched while this run was active was committed before the run's end
    # (both write the task's row), so an empty read here needs no lock to be sure.
    if pending:
        _feedback_start(task_id, workspace_id)
    # The run's slot is free: as many deferred tasks of its workspace as now fit start.
    # With none deferred when the run's row was read, re-admission has nothing to take;
    # a task deferred after that read (by a submission that counted this run as
    # active) is let in by the re-admission schedule.
    if pending or deferred:
        tasks_readmit(workspace_id=workspace_id)


def _feedback_start(task_id: uuid.UUID, workspace_id: int) -> None:
    """Start the follow-up batched for a task whose run ended, or defer it."""
    with transaction.atomic():
        ws = _lock_workspace(workspace_id)
        task = Task.objects.select_for_update().select_related("repository").get(pk=task_id)
        if (
            task.pending_feedback
            and task.status != Task.Status.DEFERRED
            and not task.runs.filter(status__in=ACTIVE).exists()
        ):
            feedback = task.pending_feedback
            refusal = admission_check(workspace=ws, repository=task.repository)
            if refusal is not None:
                _feedback_defer(task, feedback, refusal)
            else:
                Task.objects.filter(pk=task.pk).update(pending_feedback="")
                _run_start(task=task, feedback=feedback, actor="feedback")


def run_recover_stalled(*, stall_after: timedelta, limit: int = 200) -> int:
    """Re-send wake-ups for steppable runs that nobody holds and nothing moved for a while
    (their message was lost). Duplicates are harmless: the step number fences them.

    A run re-woken at ``t`` is not re-woken before ``t + stall_after * 2**wakes`` (capped
    at an hour): if its message is only waiting in a long queue, the sweep adds one more
    now and then, not one per tick. One sweep at a time, at most ``limit`` per tick.
    """

    now = timezone.now()
    cutoff = now - stall_after
    idle = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    count = 0
    # The lock covers the sends and their woken_at: a concurrent sweep skips.
    with sweep_lock("run-stall") as held:
        if not held:
            return 0
        candidates = list(
            Run.objects.filter(status__in=STEPPABLE, lease_until__isnull=True)
            .filter(idle)
            .filter(Q(woken_at__isnull=True) | Q(woken_at__lt=cutoff))
            .order_by("woken_at", "created_at")
            .values_list("pk", "step_no", "status", "woken_at", "wakes")[: limit * 4]
        )
        for run_id, step_no, status, woken_at, wakes in candidates:
            wait = min(3600.0, stall_after.total_seconds() * (2 ** min(wakes, 16)))
            if woken_at is not None and (now - woken_at).total_seconds() < wait:
                continue
            try:
                dispatch.run_wake(run_id=run_id, step_no=step_no, status=status)
            except Exception:  # the broker is down: the next tick tries again
                log.warning("run.stall_wake_failed", run_id=str(run_id), exc_info=True)
                break
            Run.objects.filter(pk=run_id, step_no=step_no).update(
                woken_at=timezone.now(), wakes=F("wakes") + 1
            )
            count += 1
            if count >= limit:
                break
    return count
