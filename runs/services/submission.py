"""Submitting a task: one transaction that records it, admits or defers it and, when
admitted, queues its first run; idempotent on (workspace, Idempotency-Key)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from jobs import redis_round
from runs import dispatch, priorities, type_limits
from runs.agent.profiles import ProfileError, profile_get
from runs.identities import idempotency_key_reserved
from runs.models import (
    Repository,
    Run,
    Task,
    Workspace,
)
from runs.services.admission import (
    _admission_counted,
    _lanes,
    _lock_workspace,
    _NearLimit,
    admission_check,
    request_fingerprint,
)
from runs.services.errors import CommandRefused, IdempotencyConflict, IdempotencyKeyReserved
from runs.timeline import (
    PendingEvent,
    events_record,
)


@dataclass
class Submission:
    task: Task
    run: Run | None
    created: bool

    @property
    def status(self) -> str:
        return self.task.status


def task_submit(
    *,
    workspace: Workspace,
    repository: Repository,
    instruction: str,
    source: str = Task.Source.API,
    requested_by: str = "",
    idempotency_key: str | None = None,
    execution_mode: str = Task.Mode.AUTONOMOUS_PR,
    risk_level: str = Task.Risk.LOW,
    task_type: str = "change",
    target_branch: str = "",
    priority: int | str | None = None,
    budget: dict[str, Any] | None = None,
    model_options: dict[str, Any] | None = None,
    source_ref: dict[str, Any] | None = None,
    plan_review: bool | None = None,
) -> Submission:
    """Record a task and, if admitted, its first run; all in one transaction.

    With an idempotency key, a repeat of the same request returns the original task;
    the same key with a different request is refused.
    """
    priority = _submission_check(
        workspace=workspace,
        repository=repository,
        instruction=instruction,
        source=source,
        idempotency_key=idempotency_key,
        priority=priority,
        model_options=model_options,
    )
    fingerprint = request_fingerprint(
        {
            "repository": repository.pk,
            "instruction": instruction,
            "execution_mode": execution_mode,
            "risk_level": risk_level,
            "task_type": task_type,
            "target_branch": target_branch,
            "priority": priority,
            "budget": budget or {},
            "model_options": model_options or {},
            **({} if plan_review is None else {"plan_review": plan_review}),
        }
    )
    fields = {
        "instruction": instruction,
        "source": source,
        "requested_by": requested_by,
        "idempotency_key": idempotency_key,
        "execution_mode": execution_mode,
        "risk_level": risk_level,
        "task_type": task_type,
        "target_branch": target_branch,
        "priority": priority,
        "budget": budget,
        "model_options": model_options,
        "source_ref": source_ref,
        "plan_review": plan_review,
    }
    return _submission_admit(
        workspace=workspace, repository=repository, fingerprint=fingerprint, fields=fields
    )


def _submission_check(
    *,
    workspace: Workspace,
    repository: Repository,
    instruction: str,
    source: str,
    idempotency_key: str | None,
    priority: int | str | None,
    model_options: dict[str, Any] | None,
) -> int:
    """Refuse a submission that cannot be recorded (``CommandRefused``); its priority."""
    if repository.workspace_id != workspace.pk:
        raise CommandRefused("repository_not_in_workspace", "repository is not in this workspace")
    if not instruction.strip():
        raise CommandRefused("instruction_empty", "instruction must not be empty")
    try:
        priority = priorities.submitted(priority, repository)
    except priorities.PriorityInvalid as exc:
        raise CommandRefused("priority_invalid", str(exc)) from exc
    if source != Task.Source.WEBHOOK and idempotency_key_reserved(idempotency_key):
        raise IdempotencyKeyReserved()
    profile = (
        (model_options or {}).get("profile")
        or (model_options or {}).get("provider")
        or repository.model_profile
        or workspace.model_profile
    )
    if profile:
        try:
            profile_get(str(profile))
        except ProfileError as exc:
            raise CommandRefused("model_profile_unknown", str(exc)) from exc
    return priority


def _submission_admit(
    *, workspace: Workspace, repository: Repository, fingerprint: str, fields: dict[str, Any]
) -> Submission:
    """Record the task, admitted in a lane or under the exclusive lock, or deferred; the
    original submission when its Idempotency-Key was used for the same request."""
    # Each way of admitting that cannot decide hands over to the next, stricter one: in a
    # lane, then alone under the exclusive lock.
    attempts: list[Any] = []
    admits_in_lane = _lanes_may_admit(workspace, repository)
    # A limited task type is counted under the exclusive lock only (runs.type_limits).
    in_lanes = not type_limits.applies(workspace, repository, fields["task_type"])
    if in_lanes and _lanes():
        attempts.append(
            functools.partial(_task_create, exclusive=False, admits_in_lane=admits_in_lane)
        )
    attempts.append(functools.partial(_task_create, exclusive=True))
    # A repeated Idempotency-Key is found by its unique constraint: the insert below
    # fails and the original is returned, so a new key costs no lookup beforehand.
    for attempt in attempts:
        try:
            return attempt(
                workspace=workspace, repository=repository, fingerprint=fingerprint, **fields
            )
        except _NearLimit:
            continue
        except IntegrityError:
            # The key was used before (or by a concurrent submission that won the insert).
            if fields["idempotency_key"]:
                existing = _idempotent_replay(workspace, fields["idempotency_key"], fingerprint)
                if existing is not None:
                    return existing
            raise
    raise AssertionError("the exclusive admission path never raises _NearLimit")


def _lanes_may_admit(workspace: Workspace, repository: Repository) -> bool:
    """Whether a submission holding a lane could ever be admitted: one run per lane is
    kept in reserve, so under a limit no larger than the number of lanes (the defaults:
    10 for a workspace, 3 for a repository, 8 lanes) a lane admits nothing. Such a
    submission skips the one-round-trip attempt, which could only write nothing, and
    its lane only defers (on the exact count), handing one that fits to the exclusive
    check at once."""
    lanes = _lanes()
    if not lanes or workspace.max_active_runs <= lanes:
        return False
    deciding = _admission_counted(workspace, repository)["repository_id"] is not None
    return not deciding or repository.max_active_runs > lanes


def _task_create(
    *,
    workspace: Workspace,
    repository: Repository,
    exclusive: bool,
    fingerprint: str,
    admits_in_lane: bool = True,
    **fields: Any,
) -> Submission:
    """task_submit's transaction, under the exclusive admission lock or one lane.

    ``admits_in_lane`` false (``_lanes_may_admit``): the lane counts exactly and only
    defers; a submission that fits is redone under the exclusive lock."""
    # The commit's wake-ups (the run's worker, the relay, live views) in one round trip.
    with redis_round.together(), transaction.atomic():
        ws = _lock_workspace(workspace.pk) if exclusive else workspace
        refusal = admission_check(
            workspace=ws, repository=repository, lane=not exclusive, reserve=admits_in_lane
        )
        if exclusive and refusal is None:
            refusal = type_limits.refusal(ws, repository, fields["task_type"])
        if not exclusive and not admits_in_lane and refusal is None:
            raise _NearLimit()  # it fits by the exact count: decided alone
        if not exclusive and admits_in_lane and refusal is not None:
            # Deferring needs no exclusive lock: a task deferred on a count that is
            # already stale is seen by the re-admission that follows the run's end, which
            # takes every lane and so waits for this transaction. Only a submission that
            # might still fit is redone one at a time.
            refusal = admission_check(workspace=ws, repository=repository)
            if refusal is None:
                raise _NearLimit()
        task, run, events = _submission_new(
            ws=ws, repository=repository, refusal=refusal, fingerprint=fingerprint, **fields
        )
        _submission_insert(task=task, run=run, events=events)
        return Submission(task=task, run=run, created=True)


def _submission_new(
    *,
    ws: Workspace,
    repository: Repository,
    refusal: str | None,
    fingerprint: str,
    instruction: str,
    source: str,
    requested_by: str,
    idempotency_key: str | None,
    execution_mode: str,
    risk_level: str,
    task_type: str,
    target_branch: str,
    priority: int,
    budget: dict[str, Any] | None,
    model_options: dict[str, Any] | None,
    source_ref: dict[str, Any] | None,
    plan_review: bool | None = None,
) -> tuple[Task, Run | None, list[PendingEvent]]:
    """The new task, with the status admission decided (no second write to it), its first
    run unless deferred, and the events of both; nothing written yet."""
    task = Task(
        workspace=ws,
        repository=repository,
        status=Task.Status.DEFERRED if refusal is not None else Task.Status.RUNNING,
        status_reason=refusal or "",
        instruction=instruction,
        source=source,
        requested_by=requested_by,
        idempotency_key=idempotency_key or None,
        request_fingerprint=fingerprint,
        execution_mode=execution_mode,
        risk_level=risk_level,
        task_type=task_type,
        target_branch=target_branch,
        priority=priority,
        budget=budget or {},
        model_options=model_options or {},
        source_ref=source_ref or {},
        plan_review=plan_review,
    )
    submitted = {
        "repository": repository.name,
        "source": source,
        "execution_mode": execution_mode,
        "requested_by": requested_by,
    }
    if refusal is not None:
        return (
            task,
            None,
            [
                PendingEvent("agent.task.submitted", submitted, requested_by),
                PendingEvent("agent.task.deferred", {"reason": refusal}, requested_by),
            ],
        )
    run_no = 1
    first = [
        PendingEvent("agent.task.submitted", submitted, requested_by),
        PendingEvent("agent.task.accepted", {"run_no": run_no}, requested_by),
        PendingEvent("agent.task.queued", {"run_no": run_no}, requested_by),
        PendingEvent("agent.run.queued", {"run_no": run_no, "followup": False}, requested_by),
    ]
    # Nobody else can append to a run inserted in this transaction: its first sequence
    # numbers are reserved by the INSERT itself instead of an UPDATE.
    run = Run(
        task=task,
        workspace_id=ws.pk,
        repository_id=task.repository_id,
        run_no=run_no,
        last_sequence_no=len(first),
    )
    return task, run, first


def _submission_insert(*, task: Task, run: Run | None, events: list[PendingEvent]) -> None:
    """Insert a new task, its first run (if admitted) and the events of both, in the
    current transaction. A reused idempotency key fails the task's INSERT with an
    IntegrityError. On commit the run's wake-up goes first, then the relay's, the live
    views' and the metrics (``events_record``)."""
    task.save(force_insert=True)
    if run is not None:
        run.save(force_insert=True)
        # Registered first, so the run's wake-up is the first thing sent on commit.
        dispatch.run_wake_on_commit(run_id=run.id, step_no=0, status=run.status)
    # A run inserted in this transaction reserved its first sequence numbers itself.
    reserved = (len(events), len(events)) if run is not None else None
    events_record(task=task, run=run, events=events, reserved=reserved)


def _idempotent_replay(workspace: Workspace, key: str, fingerprint: str) -> Submission | None:
    task = Task.objects.filter(workspace=workspace, idempotency_key=key).first()
    if task is None:
        return None
    if task.request_fingerprint != fingerprint:
        raise IdempotencyConflict()
    return Submission(task=task, run=task.runs.order_by("run_no").first(), created=False)
