"""Reads the API needs that are more than a filtered queryset."""

from __future__ import annotations

import copy
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import Count, QuerySet
from django.utils import timezone

from agentplatform.api import access_cache
from jobs.models import OutboxEvent
from runs.agent.budget import budget_used
from runs.models import Membership, Repository, Run, RunEvent, Task, Workspace
from runs.services import Submission
from runs.state import TERMINAL


def repository_of_member(*, user: Any, repository_id: int) -> Repository | None:
    """The repository with this id, its workspace loaded, if ``user`` is a member there.

    A row found is remembered (``access_cache``); a repository the user may not use is
    asked for every time.
    """
    if user is None or not user.is_authenticated:
        return None
    low, high = connection.ops.integer_field_range(Repository._meta.pk.get_internal_type())
    if not low <= repository_id <= high:  # out of range matches nothing
        return None

    def read() -> RepositoryRow | None:
        repository = (
            Repository.objects.select_related("workspace")
            .filter(pk=repository_id, workspace_id__in=_member_of(user))
            .first()
        )
        if repository is None:
            return None
        return (
            tuple(getattr(repository, name) for name in _REPOSITORY_FIELDS),
            tuple(getattr(repository.workspace, name) for name in _WORKSPACE_FIELDS),
        )

    # Remembered until a membership, repository or workspace changes (access_cache).
    row = access_cache.read_through(("repository", user.pk, repository_id), read)
    if row is None:
        return None
    # Instances of this request's own, from the plain values remembered.
    repository = Repository.from_db(DEFAULT_DB_ALIAS, _REPOSITORY_FIELDS, copy.deepcopy(row[0]))
    repository.workspace = Workspace.from_db(
        DEFAULT_DB_ALIAS, _WORKSPACE_FIELDS, copy.deepcopy(row[1])
    )
    return repository


# A repository as remembered: its field values and its workspace's.
RepositoryRow = tuple[tuple[Any, ...], tuple[Any, ...]]
_REPOSITORY_FIELDS = [f.attname for f in Repository._meta.concrete_fields]
_WORKSPACE_FIELDS = [f.attname for f in Workspace._meta.concrete_fields]


def _member_of(user: Any) -> QuerySet[Membership, Any]:
    return Membership.objects.filter(user_id=user.pk).values("workspace_id")


def run_visible(*, user: Any, run_id: Any) -> bool:
    """Whether the run is in one of ``user``'s workspaces."""
    if user is None or not user.is_authenticated:
        return False
    return Run.objects.filter(pk=run_id, workspace_id__in=_member_of(user)).exists()


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
