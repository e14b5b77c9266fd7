"""Limits on active runs per task type, per workspace and per repository.

``Workspace.task_type_limits`` and ``Repository.task_type_limits`` map a task type to the
active runs it may have at once (``{"dependency_upgrade": 5}``). A submission of a
limited type is admitted only under the workspace's exclusive admission lock (never in a
lane), where its type's active runs are counted; over a limit the task is deferred like
any other, and re-admission (which holds the same lock) skips the types that are full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Q

from runs.models import Repository, Run, Workspace
from runs.state import ACTIVE


def _limit(limits: object, task_type: str) -> int | None:
    if not isinstance(limits, dict):
        return None
    value = limits.get(task_type)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def applies(workspace: Workspace, repository: Repository, task_type: str) -> bool:
    """Whether the type has a limit in the workspace or the repository."""
    return (
        _limit(workspace.task_type_limits, task_type) is not None
        or _limit(repository.task_type_limits, task_type) is not None
    )


def refusal(workspace: Workspace, repository: Repository, task_type: str) -> str | None:
    """Why a run of ``task_type`` cannot start now, or None. Under the workspace's
    exclusive admission lock."""
    in_workspace = _limit(workspace.task_type_limits, task_type)
    in_repository = _limit(repository.task_type_limits, task_type)
    active = Run.objects.filter(workspace_id=workspace.pk, status__in=ACTIVE)
    active = active.filter(task__task_type=task_type)
    if in_workspace is not None and active.count() >= in_workspace:
        return f"workspace at its limit of {in_workspace} active {task_type} runs"
    here = active.filter(repository_id=repository.pk)
    if in_repository is not None and here.count() >= in_repository:
        return f"repository at its limit of {in_repository} active {task_type} runs"
    return None


@dataclass
class Readmission:
    """The per-type counts of one re-admission pass over a workspace (under its lock)."""

    workspace: Workspace
    in_workspace: dict[str, int] = field(default_factory=dict)
    in_repository: dict[tuple[int, str], int] = field(default_factory=dict)
    full_types: set[str] = field(default_factory=set)
    full_pairs: set[tuple[int, str]] = field(default_factory=set)

    @classmethod
    def start(cls, workspace: Workspace) -> Readmission:
        rows = (
            Run.objects.filter(workspace_id=workspace.pk, status__in=ACTIVE)
            .order_by()
            .values_list("repository_id", "task__task_type")
            .annotate(n=Count("id"))
            .values_list("repository_id", "task__task_type", "n")
        )
        counts = cls(workspace=workspace)
        for repository_id, task_type, n in rows:
            counts.in_workspace[task_type] = counts.in_workspace.get(task_type, 0) + n
            counts.in_repository[(repository_id, task_type)] = n
        return counts

    def exclusion(self) -> Q:
        """Deferred tasks of types full in the workspace, or in their repository."""
        excluded = Q(task_type__in=self.full_types) if self.full_types else Q(pk__in=[])
        for repository_id, task_type in self.full_pairs:
            excluded |= Q(repository_id=repository_id, task_type=task_type)
        return excluded

    def admits(self, repository: Repository, task_type: str) -> bool:
        """Whether one more run of the type fits; counted in if so."""
        pair = (repository.pk, task_type)
        limit = _limit(self.workspace.task_type_limits, task_type)
        if limit is not None and self.in_workspace.get(task_type, 0) >= limit:
            self.full_types.add(task_type)
            return False
        limit = _limit(repository.task_type_limits, task_type)
        if limit is not None and self.in_repository.get(pair, 0) >= limit:
            self.full_pairs.add(pair)
            return False
        self.in_workspace[task_type] = self.in_workspace.get(task_type, 0) + 1
        self.in_repository[pair] = self.in_repository.get(pair, 0) + 1
        return True
