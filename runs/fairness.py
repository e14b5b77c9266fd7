"""Fair shares of the worker slots across workspaces, and the broker priority of a step.

A workspace's share is the platform's active runs weighted by ``Workspace.weight`` over
the weights of every workspace with active runs. A workspace below its share while
another workspace has active runs too gets the first broker step of its priority class
(runs.priorities.broker_priority); any other, the second. Worker slots are taken from
the broker in step order, so with workspace A holding a thousand queued steps, the one
step of workspace B (below its share) is the next one any free slot takes, whatever the
length of A's queue.

The active-run counts come from ``ActiveRunCount`` (kept by triggers) and are read at
most once per ``SNAPSHOT_SECONDS`` per process: a wake-up costs one indexed read of its
run's task, not a count.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from runs import priorities
from runs.models import ActiveRunCount, Run, Task, Workspace

SNAPSHOT_SECONDS = 1.0


@dataclass(frozen=True)
class Shares:
    active: dict[int, int]  # active runs per workspace with any
    weights: dict[int, int]

    def share_of(self, workspace_id: int) -> float:
        """The active runs ``workspace_id`` may hold while the others have runs."""
        weight = self.weights.get(workspace_id, 1)
        ids = set(self.active) | {workspace_id}
        total_weight = sum(self.weights.get(w, 1) for w in ids)
        return sum(self.active.values()) * weight / max(total_weight, 1)

    def under_share(self, workspace_id: int) -> bool:
        others = any(n > 0 for w, n in self.active.items() if w != workspace_id)
        return others and self.active.get(workspace_id, 0) < self.share_of(workspace_id)


_lock = threading.Lock()
_snapshot: tuple[float, Shares] | None = None


def shares_read() -> Shares:
    """The active runs per workspace and the weights of those workspaces, now."""
    rows = (
        ActiveRunCount.objects.filter(repository_id=0)
        .values("workspace_id")
        .annotate(n=Sum("runs"))
        .values_list("workspace_id", "n")
    )
    active = {int(ws): int(n) for ws, n in rows if n}
    weights = dict(Workspace.objects.filter(pk__in=active).values_list("pk", "weight"))
    return Shares(active=active, weights=weights)


def shares() -> Shares:
    """``shares_read``, at most ``SNAPSHOT_SECONDS`` old."""
    global _snapshot
    with _lock:
        now = time.monotonic()
        if _snapshot is None or now - _snapshot[0] > SNAPSHOT_SECONDS:
            _snapshot = (now, shares_read())
        return _snapshot[1]


def shares_forget() -> None:
    """Read the counts afresh at the next wake-up (tests)."""
    global _snapshot
    with _lock:
        _snapshot = None


def step_priority(run_id: uuid.UUID | str) -> int:
    """The broker priority of the run's next step: its task's effective priority now
    (aged) and whether its workspace is below its share."""
    row = (
        Run.objects.filter(pk=run_id)
        .values_list("task__priority", "task__created_at", "workspace_id")
        .first()
    )
    if row is None:
        return priorities.broker_priority(priorities.DEFAULT)
    base, created_at, workspace_id = row
    return priorities.broker_priority(
        priorities.effective(base, created_at), under_share=shares().under_share(workspace_id)
    )


def queue_position(task: Task, now: datetime | None = None) -> int | None:
    """A deferred task's place in its workspace's re-admission order (1: next); None for
    a task that is not deferred."""
    if task.status != Task.Status.DEFERRED:
        return None
    now = now or timezone.now()
    mine = priorities.effective(task.priority, task.created_at, now)
    ahead = (
        Task.objects.filter(workspace_id=task.workspace_id, status=Task.Status.DEFERRED)
        .annotate(effective=priorities.effective_expression(now))
        .filter(Q(effective__lt=mine) | Q(effective=mine, created_at__lt=task.created_at))
        .count()
    )
    return ahead + 1


@dataclass(frozen=True)
class WorkspaceQueue:
    """One workspace's row of the console's fairness table."""

    workspace_id: int
    workspace_slug: str
    weight: int
    active: int
    share: float  # of the platform's active runs, while others have runs
    deferred_by_class: dict[str, int]
    oldest_wait_seconds: float | None


def workspace_queues(now: datetime | None = None) -> list[WorkspaceQueue]:
    """Every workspace with active runs or deferred tasks: its share of the active runs,
    its deferred tasks per priority class and its oldest deferred task's wait."""
    now = now or timezone.now()
    current = shares_read()
    deferred = (
        Task.objects.filter(status=Task.Status.DEFERRED)
        .order_by()
        .values_list("workspace_id", "priority")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .values_list("workspace_id", "priority", "n", "oldest")
    )
    classes: dict[int, dict[str, int]] = {}
    oldest: dict[int, datetime] = {}
    for ws, priority, n, first in sorted(deferred, key=lambda row: (row[0], row[1])):
        classes.setdefault(ws, {})[priorities.name_of(priority)] = n
        oldest[ws] = min(first, oldest.get(ws, first))
    ids = set(current.active) | set(classes)
    rows = Workspace.objects.filter(pk__in=ids).values_list("pk", "slug", "weight")
    return [
        WorkspaceQueue(
            workspace_id=pk,
            workspace_slug=slug,
            weight=weight,
            active=current.active.get(pk, 0),
            share=round(current.share_of(pk), 1) if current.active else 0.0,
            deferred_by_class=classes.get(pk, {}),
            oldest_wait_seconds=(now - oldest[pk]).total_seconds() if pk in oldest else None,
        )
        for pk, slug, weight in sorted(rows, key=lambda r: r[1])
    ]
