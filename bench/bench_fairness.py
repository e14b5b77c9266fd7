"""Fairness: how many free worker slots pass before a small workspace's task starts.

Workspace A has ``queued`` admitted runs waiting on the broker, workspace B submits one
task after them; then one worker slot frees (a worker with one slot starts). Each run was
asked to cancel, so each step takes a slot briefly. The figure is the number of the free
slot that took B's run (1: the first), and the seconds until it had.
Run from ``bench.run --only fairness`` (``make bench``) or a test, on their database.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runs import fairness
from runs.models import Repository, Run, Workspace
from runs.services import run_cancel_request, task_submit
from runs.state import TERMINAL


def _workspace(slug: str, limit: int) -> Repository:
    workspace = Workspace.objects.create(slug=slug, name=slug, max_active_runs=limit)
    return Repository.objects.create(
        workspace=workspace, name="r", clone_url="/nonexistent", max_active_runs=limit
    )


def _queued(repository: Repository, n: int) -> list[Run]:
    runs = []
    for i in range(n):
        task = task_submit(
            workspace=repository.workspace, repository=repository, instruction=f"task {i}"
        ).task
        run = task.runs.get()
        run_cancel_request(run=run, by="bench")
        runs.append(run)
    return runs


def small_workspace_start(
    start_worker: Callable[[], Any], *, queued: int, tag: str, timeout: float = 300
) -> tuple[int, float]:
    """(the free slot that took B's run, seconds from the worker's start until it had)."""
    fairness.shares_forget()
    big = _queued(_workspace(f"fair-a-{tag}", queued + 10), queued)
    fairness.shares_forget()
    (small,) = _queued(_workspace(f"fair-b-{tag}", 10), 1)
    started = time.monotonic()
    start_worker()
    deadline = started + timeout
    while Run.objects.get(pk=small.pk).status not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError("the small workspace's run never ran")
        time.sleep(0.05)
    seconds = time.monotonic() - started
    ended = Run.objects.get(pk=small.pk).status_changed_at
    before = Run.objects.filter(
        pk__in=[r.pk for r in big], status__in=TERMINAL, status_changed_at__lt=ended
    ).count()
    return before + 1, seconds
