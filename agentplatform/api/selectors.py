"""Reads the API needs that are more than a filtered queryset."""

from __future__ import annotations

import functools
from typing import Any

from django.db import connection
from django.db.models import Count
from django.utils import timezone

from agentplatform.api import access_cache
from agentplatform.api.rows import rows_as_values
from jobs.db_rows import cursor_prepared, instance_from_row
from jobs.models import OutboxEvent
from runs.agent.budget import budget_used
from runs.models import Membership, Repository, Run, RunEvent, Task, Workspace
from runs.services import Submission
from runs.state import TERMINAL


def repository_of_member(*, user: Any, repository_id: int) -> Repository | None:
    """The repository with this id, its workspace loaded, if ``user`` is a member there.

    What ``Repository.objects.filter(workspace_id__in=<memberships>)
    .select_related("workspace").get(pk=...)`` returns, as one fixed statement: every
    submission looks its repository up, and compiling that queryset cost more CPU than
    the rest of the lookup. A prepared statement (``cursor_prepared``): PostgreSQL
    planned it in 0.26 ms and ran it in 0.06. A row found is remembered
    (``access_cache``); a repository the user may not use is asked for every time.
    """
    if user is None or not user.is_authenticated:
        return None
    low, high = connection.ops.integer_field_range(Repository._meta.pk.get_internal_type())
    if not low <= repository_id <= high:  # as the ORM: out of range matches nothing
        return None
    sql, split = _repository_of_member_sql()

    def read() -> tuple[Any, ...] | None:
        with cursor_prepared() as cursor:
            cursor.execute(sql, [repository_id, user.pk])
            return cursor.fetchone()  # type: ignore[no-any-return]

    # Remembered until a membership, repository or workspace changes (access_cache).
    row = access_cache.read_through(("repository", user.pk, repository_id), read)
    if row is None:
        return None
    repository = instance_from_row(Repository, row[:split])
    repository.workspace = instance_from_row(Workspace, row[split:])
    return repository


@functools.cache
def _repository_of_member_sql() -> tuple[str, int]:
    quote = connection.ops.quote_name
    repository_fields = list(Repository._meta.concrete_fields)
    workspace_fields = list(Workspace._meta.concrete_fields)
    columns = [f"r.{quote(f.column)}" for f in repository_fields]
    columns += [f"w.{quote(f.column)}" for f in workspace_fields]
    membership = Membership._meta
    repository_table, workspace_table = Repository._meta.db_table, Workspace._meta.db_table
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(repository_table)} r"  # noqa: S608 - names are ours
        f" INNER JOIN {quote(workspace_table)} w"
        f" ON (r.{quote('workspace_id')} = w.{quote('id')})"
        f" WHERE r.{quote('id')} = %s AND r.{quote('workspace_id')} IN"
        f" (SELECT m.{quote('workspace_id')} FROM {quote(membership.db_table)} m"
        f" WHERE m.{quote('user_id')} = %s)"
    )
    return sql, len(repository_fields)


def run_visible(*, user: Any, run_id: Any) -> bool:
    """Whether the run is in one of ``user``'s workspaces: what
    ``Run.objects.filter(pk=..., workspace_id__in=<memberships>).exists()`` answers, as
    one fixed statement (compiling that queryset cost more CPU than the rest of a
    timeline page)."""
    if user is None or not user.is_authenticated:
        return False
    with cursor_prepared() as cursor:
        cursor.execute(_run_visible_sql(), [_run_pk(run_id), user.pk])
        return cursor.fetchone() is not None


def run_events_rows(
    *, run_id: Any, after: int, limit: int, columns: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Up to ``limit`` events of the run after sequence ``after``, in order, as
    ``RunEvent.objects.filter(run_id=..., sequence_no__gt=after).order_by("sequence_no")
    .values(*columns)[:limit]`` returns them, from one fixed statement."""
    with cursor_prepared() as cursor:
        cursor.execute(_run_events_sql(columns), [_run_pk(run_id), after, limit])
        rows = cursor.fetchall()
    return rows_as_values(RunEvent, columns, rows)


def _run_pk(run_id: Any) -> Any:
    field = Run._meta.pk
    assert field is not None
    return field.get_db_prep_value(field.to_python(run_id), connection)


@functools.cache
def _run_visible_sql() -> str:
    quote = connection.ops.quote_name
    run, membership = quote(Run._meta.db_table), quote(Membership._meta.db_table)
    return (
        f"SELECT 1 FROM {run} r WHERE r.{quote('id')} = %s AND r.{quote('workspace_id')} IN"  # noqa: S608 - names are ours
        f" (SELECT m.{quote('workspace_id')} FROM {membership} m WHERE m.{quote('user_id')} = %s)"
    )


@functools.cache
def _run_events_sql(columns: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    selected = ", ".join(quote(RunEvent._meta.get_field(c).column) for c in columns)  # type: ignore[union-attr, arg-type]
    return (
        f"SELECT {selected} FROM {quote(RunEvent._meta.db_table)}"  # noqa: S608 - names are ours
        f" WHERE {quote('run_id')} = %s AND {quote('sequence_no')} > %s"
        f" ORDER BY {quote('sequence_no')} LIMIT %s"
    )


def submission_outcome(*, submission: Submission) -> dict[str, Any]:
    """What ``POST /api/tasks/`` answered for this submission, replays included.

    A replayed Idempotency-Key must get the original answer even though the task moved
    on since, so the answer is rebuilt from facts that never change: an accepted
    submission's first run starts its timeline with ``agent.task.submitted``; a deferred
    one recorded ``agent.task.deferred`` with its reason.
    """
    task = submission.task
    if submission.created:
        if submission.run is not None:
            return {
                "task_id": task.id,
                "run_id": submission.run.id,
                "status": Task.Status.QUEUED,
                "reason": None,
            }
        return {
            "task_id": task.id,
            "run_id": None,
            "status": Task.Status.DEFERRED,
            "reason": task.status_reason,
        }
    first = Run.objects.filter(task=task, run_no=1).first()
    if (
        first is not None
        and RunEvent.objects.filter(run=first, sequence_no=1, type="agent.task.submitted").exists()
    ):
        return {
            "task_id": task.id,
            "run_id": first.id,
            "status": Task.Status.QUEUED,
            "reason": None,
        }
    reason = task.status_reason if task.status == Task.Status.DEFERRED else ""
    if not reason:
        deferred = (
            OutboxEvent.objects.filter(partition_key=str(task.id), type="agent.task.deferred")
            .order_by("id")
            .values_list("payload", flat=True)
            .first()
        )
        reason = ((deferred or {}).get("data") or {}).get("reason", "")
    return {"task_id": task.id, "run_id": None, "status": Task.Status.DEFERRED, "reason": reason}


def run_budget_usage(*, run: Run) -> dict[str, Any]:
    """Each budget of the task: its limit and what was used, cumulative as enforced."""
    task = run.task
    usage = task.usage or {}
    checkpoint = run.checkpoint or {}
    wall = 0.0
    if run.status not in TERMINAL:
        wall = (timezone.now() - (run.started_at or run.created_at)).total_seconds()
    turns = task.runs.aggregate(n=Count("model_turns"))["n"] or 0
    used = {
        "cost_usd": float(usage.get("cost_usd", 0)) + float(run.cost_usd),
        "model_turns": float(turns),
        # As enforced: the patches the agent produced, so setup failures count none.
        "agent_attempts": budget_used(task=task, run=run, name="agent_attempts"),
        "tool_retries": float(checkpoint.get("tool_failures", 0)),
        "wall_clock_seconds": float(usage.get("wall_clock_seconds", 0)) + wall,
    }
    return {name: {"used": value, "limit": task.budget_limit(name)} for name, value in used.items()}


def run_current_step(*, run: Run) -> dict[str, Any]:
    return {
        "step_no": run.step_no,
        "status": run.status,
        "status_changed_at": run.status_changed_at,
        "lease_owner": run.lease_owner or None,
        "lease_until": run.lease_until,
        "heartbeat_at": run.heartbeat_at,
        "lease_generation": run.attempt,
        "agent_attempts": run.patches.count(),
        "recoveries": run.recoveries,
        "retries": run.retries,
        "cancel_requested_at": run.cancel_requested_at,
    }
