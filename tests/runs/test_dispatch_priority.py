"""A free worker slot takes the most urgent step, not the oldest message.

Steps are queued while no slot is free (no worker yet: every slot busy), each run asked
to cancel so that its one step is short; then a worker with one slot starts and the
order in which the runs end is the order the slot took their steps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from bench.bench_fairness import small_workspace_start
from runs import fairness
from runs.models import Run, Task
from runs.services import run_cancel_request, task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.services]


def _queued(repository: Any, n: int, priority: str) -> list[Run]:
    """``n`` admitted runs whose wake-ups wait on the broker, each asked to cancel."""
    runs = []
    for i in range(n):
        task = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction=f"{priority} {i}",
            priority=priority,
        ).task
        run = task.runs.get()
        run_cancel_request(run=run, by="test")
        runs.append(run)
    return runs


def _end_order(runs: list[Run], first: Run) -> int:
    """How many of ``runs`` had ended when ``first`` ended (once ``first`` has)."""
    wait_for(
        lambda: Run.objects.get(pk=first.pk).status in TERMINAL, timeout=90, message="first run"
    )
    ended = Run.objects.get(pk=first.pk).status_changed_at
    return Run.objects.filter(
        pk__in=[r.pk for r in runs], status__in=TERMINAL, status_changed_at__lt=ended
    ).count()


def _ws(limit: int = 1000) -> Any:
    workspace = WorkspaceFactory(max_active_runs=limit)
    return RepositoryFactory(workspace=workspace, max_active_runs=limit)


def test_emergency_overtakes_a_saturated_batch_queue(start_worker: Any) -> None:
    fairness.shares_forget()
    repository = _ws()
    batch = _queued(repository, 40, "batch")
    (emergency,) = _queued(repository, 1, "emergency")
    start_worker(queues="agent", concurrency=1)
    assert _end_order(batch, emergency) == 0
    # And the batch still runs: the slot goes on to it.
    wait_for(
        lambda: Run.objects.filter(pk__in=[r.pk for r in batch], status__in=TERMINAL).count() >= 5,
        timeout=90,
        message="batch runs",
    )


def test_aged_maintenance_step_goes_before_queued_normal_ones(start_worker: Any) -> None:
    fairness.shares_forget()
    repository = _ws()
    normal = _queued(repository, 30, "normal")
    task = task_submit(
        workspace=repository.workspace,
        repository=repository,
        instruction="maintenance",
        priority="maintenance",
    ).task
    # Submitted 240 hours ago: 500 - 480 = 20, as urgent as security by now. Its wake-up
    # for the cancellation is dispatched at that effective priority.
    Task.objects.filter(pk=task.pk).update(created_at=timezone.now() - timedelta(hours=240))
    maintenance = task.runs.get()
    run_cancel_request(run=maintenance, by="test")
    start_worker(queues="agent", concurrency=1)
    assert _end_order(normal, maintenance) == 0


def test_a_small_workspace_starts_within_one_free_slot(start_worker: Any) -> None:
    """The mechanism is the broker's priority lists: the count of workspace A's queued
    steps does not matter, so 300 stand for the 1,000 of the scenario (``make bench``
    measures 1,000 with the same code, bench/bench_fairness.py)."""
    slot, _ = small_workspace_start(
        lambda: start_worker(queues="agent", concurrency=1), queued=300, tag="test"
    )
    assert slot == 1
