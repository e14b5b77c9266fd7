"""Admission (docs/design.md §3): whether a workspace, a repository and a budget have room
for one more run, serialised so that two submissions never take the last slot; and the
re-admission of deferred tasks."""

from __future__ import annotations

import functools
import hashlib
import json
import random
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

from runs import dispatch, priorities, type_limits
from runs.models import (
    ActiveRunCount,
    Repository,
    Run,
    RunImport,
    Task,
    Workspace,
    WorkspaceSpend,
)
from runs.services.errors import CommandRefused
from runs.spend import spend_day, workspace_spend_today
from runs.state import ACTIVE
from runs.timeline import (
    PendingEvent,
    events_record,
)


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
