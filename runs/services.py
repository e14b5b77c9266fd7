"""Use cases that change runs and tasks. Each is one transaction; wake-ups go on commit.

These are commands: they can be refused (``CommandRefused``). They never set a run's
status themselves; they record a request (cancellation, an approval decision) and wake
the orchestrator, which decides.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, F, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from jobs import redis_round
from runs import dispatch, priorities, type_limits
from runs.identities import idempotency_key_reserved, requested_by_user
from runs.logs import log
from runs.models import (
    ActiveRunCount,
    Approval,
    Membership,
    Repository,
    Run,
    RunImport,
    Task,
    Workspace,
    WorkspaceSpend,
)
from runs.spend import spend_day, workspace_spend_today
from runs.state import ACTIVE, TERMINAL
from runs.timeline import (
    PendingEvent,
    event_record,
    events_record,
)


class CommandRefused(Exception):
    """A command that cannot be carried out; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ApprovalNotAllowed(CommandRefused):
    """The workspace's approval policy does not let this person decide."""


class IdempotencyConflict(CommandRefused):
    def __init__(self) -> None:
        super().__init__(
            "idempotency_key_reused", "this Idempotency-Key was used with a different request"
        )


class IdempotencyKeyReserved(CommandRefused):
    def __init__(self) -> None:
        super().__init__(
            "idempotency_key_reserved",
            "Idempotency-Key values starting with github: or gitlab: are reserved for "
            "tasks the platform creates from provider events",
        )


@dataclass
class Submission:
    task: Task
    run: Run | None
    created: bool

    @property
    def status(self) -> str:
        return self.task.status


def request_fingerprint(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# --- admission -----------------------------------------------------------------------------


def admission_check(
    *, workspace: Workspace, repository: Repository, lane: bool = False, reserve: bool = True
) -> str | None:
    """Why a new run cannot start now, or None.

    Call under the workspace's exclusive admission lock (``_lock_workspace``), or with
    ``lane``: an admission lane is taken first, in the same round trip as the count
    (``_lane_take_sql``), and one run per lane is kept in reserve (none without
    ``reserve``: the exact count, for a submission that only defers in a lane).
    """
    margin = _lanes() if lane and reserve else 0
    budget = workspace.daily_cost_budget_usd
    in_workspace, in_repository, spent = _admission_counts(
        **_admission_counted(workspace, repository), lane=lane
    )
    if in_workspace + margin >= workspace.max_active_runs:
        return _workspace_full(workspace)
    if in_repository + margin >= repository.max_active_runs:
        return _repository_full(repository)
    # Spend that a turn has not committed yet is not counted (see _budget_refusal).
    if budget > 0 and spent >= budget:
        return _budget_spent(budget)
    return None


def _admission_counted(workspace: Workspace, repository: Repository) -> dict[str, Any]:
    """What admission counts for a submission to ``repository`` (``_admission_counts``'s
    arguments)."""
    # The repository's runs are among the workspace's: under a limit no lower than the
    # workspace's, its count never refuses what the workspace's count let through, and
    # the workspace's alone is read.
    repository_decides = repository.max_active_runs < workspace.max_active_runs
    return {
        "workspace_id": workspace.pk,
        "repository_id": repository.pk if repository_decides else None,
        "spend": workspace.daily_cost_budget_usd > 0,
    }


def _active_runs_count(*, workspace_id: int, repository_id: int) -> tuple[int, int]:
    """Active runs of the workspace and, among them, of the repository, in full."""
    in_workspace, in_repository, _ = _admission_counts(
        workspace_id=workspace_id, repository_id=repository_id, spend=False
    )
    return in_workspace, in_repository


def _admission_counts(
    *,
    workspace_id: int,
    repository_id: int | None,
    spend: bool,
    lane: bool = False,
) -> tuple[int, int, Decimal]:
    """Active runs of the workspace and, among them, of the repository and, with
    ``spend``, the workspace's spend today (``workspace_spend_today``), read by one
    statement (one snapshot). Without ``repository_id`` the repository's count is 0.

    The counts are the sums of the workspace's and the repository's rows in
    ``ActiveRunCount``, which triggers on runs keep in the transactions that change them:
    a few rows, however many runs are active. Every submission counts: a fixed
    statement, not a queryset built each time.

    ``lane``: take an admission lane of the workspace first, in the same round trip. The
    count is a statement of its own after it, so its snapshot is taken once the lane is
    held and sees every admission that let its lane go.
    """
    params = _admission_counts_params(
        workspace_id=workspace_id, repository_id=repository_id, spend=spend
    )
    counts = _admission_counts_sql(spend, repository_id is not None)
    with connection.cursor() as cursor:
        if lane:
            cursor.execute(*_lane_take_sql(workspace_id))
        cursor.execute(counts, params)
        row = cursor.fetchone()
    assert row is not None  # an aggregate: always one row
    in_workspace, in_repository, spent = row
    return int(in_workspace), int(in_repository), Decimal(spent or 0)


def _admission_counts_params(
    *, workspace_id: int, repository_id: int | None, spend: bool
) -> list[Any]:
    """The parameters of ``_admission_counts_sql(spend, repository_id is not None)``."""
    params: list[Any] = [] if repository_id is None else [repository_id]
    if spend:
        params += [workspace_id, spend_day()]
    return [*params, workspace_id, *([] if repository_id is None else [repository_id])]


def _admission_counts_sql(spend: bool, per_repository: bool) -> str:
    """The statement of ``_admission_counts``: its parameters ``_admission_counts_params``."""
    return _admission_counts_text(spend, per_repository)


@functools.cache
def _admission_counts_text(spend: bool, per_repository: bool) -> str:
    quote = connection.ops.quote_name
    repository = quote("repository_id")
    spent = "NULL"
    if spend:
        # As workspace_spend_today reads it: the row of the workspace's current UTC day.
        table = quote(WorkspaceSpend._meta.db_table)
        spent = (
            f"(SELECT {quote('cost_usd')} FROM {table}"  # noqa: S608 - names are ours
            f" WHERE {quote('workspace_id')} = %s AND {quote('day')} = %s)"
        )
    # The workspace's rows (repository 0) and, when asked, the repository's: read
    # through the primary key (workspace, repository, stripe), a range for each.
    counts = quote(ActiveRunCount._meta.db_table)
    runs = quote("runs")
    in_repository = (
        f"COALESCE(SUM({runs}) FILTER (WHERE {repository} = %s), 0)" if per_repository else "0"
    )
    repositories = "IN (0, %s)" if per_repository else "= 0"
    in_workspace = (
        f"COALESCE(SUM({runs}) FILTER (WHERE {repository} = 0), 0)"
        if per_repository
        else f"COALESCE(SUM({runs}), 0)"
    )
    return (
        f"SELECT {in_workspace}, {in_repository}, {spent} FROM {counts}"  # noqa: S608
        f" WHERE {quote('workspace_id')} = %s AND {repository} {repositories}"
    )


def _workspace_full(workspace: Workspace) -> str:
    return f"workspace at its limit of {workspace.max_active_runs} active runs"


def _repository_full(repository: Repository) -> str:
    return f"repository at its limit of {repository.max_active_runs} active runs"


def _budget_refusal(workspace: Workspace) -> str | None:
    budget = workspace.daily_cost_budget_usd
    # Spend that a turn has not committed yet is not counted: a budget stops new runs
    # once the day's stored spend reaches it, and runs already admitted go on.
    if budget > 0 and workspace_spend_today(workspace_id=workspace.pk) >= budget:
        return _budget_spent(budget)
    return None


def _budget_spent(budget: Decimal) -> str:
    return f"workspace spent its daily budget of ${budget}"


# Admission counts active runs and then inserts one; that check-then-act must not let two
# submissions both take the last slot. Far from the limits it needs no serialising: a
# submission holds one of ``ADMISSION_LANES`` transaction-scoped advisory locks (a lane)
# while it counts and inserts, and admits only if the count plus one run per lane still
# fits. Whoever counts last then sees every other admission either committed or holding a
# lane, so the limit holds. Near a limit the submission takes every lane
# and the workspace row instead: the exact check, one at a time.
_LANE_KEY = 0x61640000  # advisory-lock key space: (lane key + lane, workspace id)
# The transaction's lane, for the triggers of migration 0020 (ActiveRunCount's stripes).
LANE_SETTING = "agentplatform.admission_lane"


class _NearLimit(Exception):
    """The lane's margin does not fit: redo the submission under the exclusive lock."""


def _lanes() -> int:
    return settings.ADMISSION_LANES


def _lock_workspace(workspace_id: int) -> Workspace:
    """Exclusive admission for the workspace: every lane (in order), then its row."""
    lanes = _lanes()
    if lanes:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_advisory_xact_lock(%s + lane, %s)) "
                "FROM generate_series(0, %s) AS lane",
                [_LANE_KEY, workspace_id % 2**31, lanes - 1],
            )
    return Workspace.objects.select_for_update().get(pk=workspace_id)


def _lane_take_sql(workspace_id: int) -> tuple[str, list[Any]]:
    """The statement that holds one admission lane of the workspace until the transaction
    ends: the first free lane, tried in random order, or, with every lane busy, a wait
    for a random one. It answers the lane taken, and records it for the transaction as
    ``agentplatform.admission_lane``: the triggers that count active runs add this
    transaction's to the lane's stripe (see ``ActiveRunCount``)."""
    lanes = int(_lanes())
    key = workspace_id % 2**31
    waited = random.randrange(lanes)
    return (
        # MATERIALIZED keeps the try-lock out of the lane list (a pushed-down filter would
        # try, and take, every lane). COALESCE evaluates its second argument, the wait,
        # only when no lane was free. The number of lanes is in the text, not a parameter:
        # with it unknown PostgreSQL priced its generic plan for a thousand lanes and
        # planned the statement again on every submission.
        f"SELECT set_config('{LANE_SETTING}', COALESCE((WITH lanes AS MATERIALIZED"  # noqa: S608
        f" (SELECT lane FROM generate_series(0, {lanes - 1}) AS lane ORDER BY random())"
        " SELECT lane FROM lanes WHERE pg_try_advisory_xact_lock(%s + lane, %s) LIMIT 1),"
        " (SELECT %s::int FROM pg_advisory_xact_lock(%s + %s, %s)))::text, true)",
        [_LANE_KEY, key, waited, _LANE_KEY, waited, key],
    )


def _run_start(*, task: Task, feedback: str = "", actor: str = "") -> Run:
    """Create the task's next run and its first events; dispatch on commit."""
    if RunImport.objects.filter(run__task=task).exists():
        raise CommandRefused("task_imported", "an imported task is read-only")
    run_no = (task.runs.aggregate(n=Max("run_no"))["n"] or 0) + 1
    run = Run.objects.create(task=task, run_no=run_no, feedback=feedback)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING, status_reason="", updated_at=timezone.now()
    )
    task.status = Task.Status.RUNNING
    # Registered first, so the run's wake-up is the first thing sent on commit.
    dispatch.run_wake_on_commit(run_id=run.id, step_no=0, status=run.status)
    events_record(
        task=task,
        run=run,
        events=[
            PendingEvent("agent.task.accepted", {"run_no": run_no}, actor),
            PendingEvent("agent.run.queued", {"run_no": run_no, "followup": bool(feedback)}, actor),
        ],
    )
    return run


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
        from runs.agent.profiles import ProfileError, profile_get

        try:
            profile_get(str(profile))
        except ProfileError as exc:
            raise CommandRefused("model_profile_unknown", str(exc)) from exc
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
    # Each way of admitting that cannot decide hands over to the next, stricter one: in a
    # lane, then alone under the exclusive lock.
    attempts: list[Any] = []
    admits_in_lane = _lanes_may_admit(workspace, repository)
    # A limited task type is counted under the exclusive lock only (runs.type_limits).
    in_lanes = not type_limits.applies(workspace, repository, task_type)
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
            if idempotency_key:
                existing = _idempotent_replay(workspace, idempotency_key, fingerprint)
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


def tasks_readmit(*, workspace_id: int | None = None, batch: int = 100) -> int:
    """Start runs for deferred tasks as far as capacity allows now: per workspace (one, or
    every workspace with deferred tasks), most urgent effective priority (aged, see
    runs.priorities) and oldest first.

    Each pass holds the workspace's exclusive admission lock, counts its free capacity
    once and admits up to ``batch`` tasks; passes repeat while a whole batch went in. A
    task whose repository is full is skipped, not waited behind, and one workspace's
    queue never hides another's.
    """
    if workspace_id is None:
        workspaces = list(
            Task.objects.filter(status=Task.Status.DEFERRED)
            .order_by()
            .values_list("workspace_id", flat=True)
            .distinct()
        )
    else:
        workspaces = [workspace_id]
    started = 0
    for ws_id in workspaces:
        while True:
            admitted = _workspace_readmit(ws_id, batch)
            started += admitted
            if admitted < batch:
                break
    return started


def _workspace_readmit(workspace_id: int, batch: int) -> int:
    """One re-admission pass over a workspace's deferred tasks; how many started."""
    with transaction.atomic():
        if not Task.objects.filter(workspace_id=workspace_id, status=Task.Status.DEFERRED).exists():
            return 0
        ws = _lock_workspace(workspace_id)
        # By the workspace and repository each run carries: the run_active index alone.
        active = Run.objects.filter(workspace=ws, status__in=ACTIVE)
        room = min(batch, ws.max_active_runs - active.count())
        if room <= 0 or _budget_refusal(ws) is not None:
            return 0
        per_repository = dict(
            active.order_by()
            .values_list("repository_id")
            .annotate(n=Count("id"))
            .values_list("repository_id", "n")
        )
        full: set[int] = set()
        by_type = type_limits.Readmission.start(ws)
        admitted = 0
        while admitted < room:
            candidates = list(
                Task.objects.select_for_update(of=("self",))
                .select_related("repository")
                .filter(workspace=ws, status=Task.Status.DEFERRED)
                .exclude(repository_id__in=full)
                .exclude(by_type.exclusion())
                .order_by(*priorities.readmission_order())[: room - admitted]
            )
            if not candidates:
                break
            for task in candidates:
                repository = task.repository
                if repository.pk in full:
                    continue
                if per_repository.get(repository.pk, 0) >= repository.max_active_runs:
                    full.add(repository.pk)
                    continue
                if not by_type.admits(repository, task.task_type):
                    continue
                # A deferred follow-up carries its feedback into the run it was waiting for.
                feedback = task.pending_feedback
                if feedback:
                    Task.objects.filter(pk=task.pk).update(pending_feedback="")
                _run_start(task=task, feedback=feedback, actor="admission")
                per_repository[repository.pk] = per_repository.get(repository.pk, 0) + 1
                admitted += 1
        return admitted


# --- commands on runs ------------------------------------------------------------------------


def run_cancel_request(*, run: Run, by: str, reason: str = "") -> bool:
    """Ask for cancellation; the orchestrator stops the run at its next check.

    Returns False if the run already ended (nothing to cancel).
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("task").get(pk=run.pk)
        if locked.status in TERMINAL:
            return False
        # A run that no worker holds (queued, awaiting approval) needs a wake-up to end;
        # sent first on commit, before the event's wake-ups.
        dispatch.run_wake_on_commit(run_id=locked.id, step_no=locked.step_no, status=locked.status)
        if locked.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(
                cancel_requested_at=timezone.now(),
                cancel_requested_by=by,
                cancel_reason=reason[:500],
            )
            event_record(
                task=locked.task,
                run=locked,
                type="agent.run.cancel.requested",
                data={"by": by, "reason": reason},
                actor=by,
            )
    return True


def approval_permission_check(*, run: Run, user: Any) -> None:
    """Raise ApprovalNotAllowed unless the workspace's policy lets ``user`` decide.

    Who may decide is the workspace's setting (``approval_by``): its approvers and admins
    (the default), or any member; superusers always may. Whoever asked for a high-risk
    task may not approve it themselves unless the workspace allows it.
    """
    task = run.task
    workspace = task.workspace
    role = (
        Membership.objects.filter(workspace=workspace, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if not user.is_superuser:
        if role is None:
            raise ApprovalNotAllowed("approval_not_allowed", "not a member of the workspace")
        allowed = (
            {Membership.Role.APPROVER, Membership.Role.ADMIN}
            if workspace.approval_by == Workspace.ApprovalBy.APPROVERS
            else set(Membership.Role)
        )
        if role not in allowed:
            raise ApprovalNotAllowed(
                "approval_not_allowed",
                f"the workspace lets {workspace.get_approval_by_display()} decide; "
                f"your role is {role}",
            )
    if (
        task.risk_level == Task.Risk.HIGH
        and requested_by_user(task=task, user=user)
        and not workspace.approval_self_high_risk
    ):
        raise ApprovalNotAllowed(
            "self_approval_not_allowed",
            "a high-risk task needs someone other than its requester to approve it",
        )


def _approval_fresh_check(approval: Approval, *, patch_sha256: str | None, seen_at: Any) -> None:
    """Refuse (approval_stale) a decision about another patch than the pending one.

    ``patch_sha256`` is the diff's SHA-256 the decider names, in full (API, console) or
    as a prefix of at least 7 hex digits (a PR comment); ``seen_at`` is when the decider
    wrote a decision that names no patch: one written before this patch was put up for
    approval cannot be about it.
    """
    if patch_sha256 is not None and (
        len(patch_sha256) < 7 or not approval.patch_sha256.startswith(patch_sha256.lower())
    ):
        raise CommandRefused(
            "approval_stale",
            "the patch pending approval is not the one that was shown; reload and look again",
        )
    if seen_at is not None and approval.requested_at > seen_at:
        raise CommandRefused(
            "approval_stale",
            "the patch pending approval was put up after this decision was written",
        )


def _approval_decide(
    *,
    run: Run,
    by: str,
    status: str,
    comment: str,
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("task__workspace").get(pk=run.pk)
        if locked.status != Run.Status.AWAITING_APPROVAL:
            raise CommandRefused(
                "not_awaiting_approval", f"run is {locked.status}, not awaiting approval"
            )
        approval = (
            Approval.objects.select_for_update()
            .filter(run=locked, status=Approval.Status.PENDING)
            .first()
        )
        if approval is None:
            raise CommandRefused("no_pending_approval", "run has no pending approval")
        # Rejecting stops a change: the requester may always withdraw their own.
        withdrawal = (
            status == Approval.Status.REJECTED
            and user is not None
            and requested_by_user(task=locked.task, user=user)
        )
        if user is None:
            # Every path (API, console, PR comment) decides as a platform user, so one
            # policy holds for all of them.
            raise ApprovalNotAllowed("approval_not_allowed", "a decision needs a platform user")
        if not withdrawal:
            approval_permission_check(run=locked, user=user)
        _approval_fresh_check(approval, patch_sha256=patch_sha256, seen_at=seen_at)
        approval.status = status
        approval.decided_at = timezone.now()
        approval.decided_by = by
        approval.comment = comment
        approval.save(update_fields=["status", "decided_at", "decided_by", "comment"])
        dispatch.run_wake_on_commit(run_id=locked.id, step_no=locked.step_no, status=locked.status)
        event_record(
            task=locked.task,
            run=locked,
            type=f"agent.approval.{status}",
            data={"by": by, "comment": comment, "patch_sha256": approval.patch_sha256},
            actor=by,
        )
    return approval


def run_approve(
    *,
    run: Run,
    by: str,
    comment: str = "",
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    """Approve the pending patch; the run goes on to open its pull request.

    With ``user`` the workspace's approval policy applies: the API, the console and a
    PR comment (through the commenter's linked provider identity) all pass it. With
    ``patch_sha256`` (or a prefix of it), only that exact diff is approved.
    """
    return _approval_decide(
        run=run,
        by=by,
        status=Approval.Status.APPROVED,
        comment=comment,
        user=user,
        patch_sha256=patch_sha256,
        seen_at=seen_at,
    )


def run_reject(
    *,
    run: Run,
    by: str,
    comment: str = "",
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    """Reject the pending patch; the run ends failed (approval_rejected)."""
    return _approval_decide(
        run=run,
        by=by,
        status=Approval.Status.REJECTED,
        comment=comment,
        user=user,
        patch_sha256=patch_sha256,
        seen_at=seen_at,
    )


def approvals_expire(*, now: Any = None) -> int:
    """Expire pending approvals past their deadline and wake their runs.

    Locks the run first and the approval second, the order every approval command uses,
    so expiry racing an approve cannot deadlock. An approval whose run is no longer
    waiting for it is voided, not expired: no ``approval.expired`` after a run ended.
    """
    now = now or timezone.now()
    expired = 0
    for approval_id, run_id in Approval.objects.filter(
        status=Approval.Status.PENDING, expires_at__lt=now
    ).values_list("pk", "run_id")[:200]:
        with transaction.atomic():
            run = Run.objects.select_for_update().select_related("task").get(pk=run_id)
            approval = (
                Approval.objects.select_for_update()
                .filter(pk=approval_id, status=Approval.Status.PENDING)
                .first()
            )
            if approval is None:
                continue
            if run.status != Run.Status.AWAITING_APPROVAL:
                approvals_void(run_id=run.pk, now=now)
                continue
            approval.status = Approval.Status.EXPIRED
            approval.decided_at = now
            approval.save(update_fields=["status", "decided_at"])
            dispatch.run_wake_on_commit(run_id=run.id, step_no=run.step_no, status=run.status)
            event_record(
                task=run.task,
                run=run,
                type="agent.approval.expired",
                data={"expired_at": approval.expires_at.isoformat()},
            )
            expired += 1
    return expired


def approvals_void(*, run_id: Any, now: Any = None) -> int:
    """Void the run's pending approvals (the run ended); call under the run's row lock."""
    return _approvals_pending(run_id).update(**_approvals_voided(now))


def _approvals_pending(run_id: Any) -> QuerySet[Approval]:
    return Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING)


def _approvals_voided(now: Any) -> dict[str, Any]:
    return {
        "status": Approval.Status.VOID,
        "decided_at": now or timezone.now(),
        "reason": "run ended",
    }


def _pull_request_merged(task: Task) -> bool:
    from runs.models import PullRequest

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
    from jobs.locks import sweep_lock
    from runs.state import STEPPABLE

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
