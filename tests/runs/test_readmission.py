"""Deferred tasks are re-admitted as far as capacity allows, promptly and in order.

When a run ends, its after-terminal work starts as many deferred tasks of its workspace
as now fit, in one pass under the admission lock (not one locked check per candidate);
the periodic sweep does the same for every workspace, so a long queue in one workspace
never hides another's.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs.models import Run, Task
from runs.services import run_after_terminal, task_submit, tasks_readmit
from runs.spend import workspace_spend_add
from runs.state import ACTIVE
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


def submit(repository, n: int, **kwargs) -> Task:
    return task_submit(
        workspace=repository.workspace,
        repository=repository,
        instruction=f"task {n}",
        **kwargs,
    ).task


def active(workspace) -> int:
    return Run.objects.filter(task__workspace=workspace, status__in=ACTIVE).count()


def end_runs(workspace) -> list[Run]:
    runs = list(Run.objects.filter(task__workspace=workspace, status__in=ACTIVE))
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(status=Run.Status.TIMED_OUT)
    return runs


def started_order(workspace) -> list[str]:
    return list(
        Run.objects.filter(task__workspace=workspace)
        .order_by("created_at", "id")
        .values_list("task__instruction", flat=True)
    )


def test_one_ended_run_fills_every_free_slot_in_submission_order():
    repository = RepositoryFactory(workspace__max_active_runs=5, max_active_runs=100)
    workspace = repository.workspace
    tasks = [submit(repository, n) for n in range(17)]
    assert [t.status for t in tasks].count(Task.Status.DEFERRED) == 12

    rounds = 0
    while Task.objects.filter(workspace=workspace, status=Task.Status.DEFERRED).exists():
        ended = end_runs(workspace)
        # Only one of the ended runs' after-terminal items has run yet: it alone refills.
        run_after_terminal(run_id=ended[0].pk)
        assert active(workspace) == min(5, len(tasks) - 5 * (rounds + 1))
        rounds += 1
        assert rounds <= 3, "each freed slot is taken at once"
    assert started_order(workspace) == [f"task {n}" for n in range(17)]


def test_the_sweep_is_not_blocked_by_a_long_queue_in_another_workspace():
    crowded = RepositoryFactory(workspace__max_active_runs=1, max_active_runs=100)
    for n in range(60):
        submit(crowded, n)
    other = RepositoryFactory(workspace__max_active_runs=0, max_active_runs=100)
    waiting = [submit(other, n) for n in range(3)]
    assert {t.status for t in waiting} == {Task.Status.DEFERRED}
    other.workspace.max_active_runs = 5
    other.workspace.save()

    assert tasks_readmit() == 3
    assert active(other.workspace) == 3
    assert active(crowded.workspace) == 1


def test_a_full_repository_is_skipped_not_waited_behind():
    workspace = WorkspaceFactory(max_active_runs=10)
    busy = RepositoryFactory(workspace=workspace, max_active_runs=1)
    free = RepositoryFactory(workspace=workspace, max_active_runs=10)
    submit(busy, 0)
    workspace.max_active_runs = 1
    workspace.save()
    behind_busy = [submit(busy, n) for n in range(1, 4)]
    behind_free = [submit(free, n) for n in range(4, 7)]
    workspace.max_active_runs = 10
    workspace.save()

    assert tasks_readmit(workspace_id=workspace.pk) == 3
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in behind_busy])} == {
        Task.Status.DEFERRED
    }
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in behind_free])} == {
        Task.Status.RUNNING
    }


def test_higher_priority_goes_first_then_the_oldest():
    repository = RepositoryFactory(workspace__max_active_runs=1, max_active_runs=100)
    workspace = repository.workspace
    submit(repository, 0)
    submit(repository, 1)
    submit(repository, 2, priority=50)
    submit(repository, 3)
    end_runs(workspace)
    workspace.max_active_runs = 2
    workspace.save()

    assert tasks_readmit(workspace_id=workspace.pk) == 2
    assert started_order(workspace) == ["task 0", "task 2", "task 1"]


def test_a_workspace_over_its_daily_budget_admits_nothing():
    repository = RepositoryFactory(workspace__max_active_runs=1, max_active_runs=100)
    workspace = repository.workspace
    submit(repository, 0)
    submit(repository, 1)
    Run.objects.filter(task__workspace=workspace).update(status=Run.Status.COMPLETED, cost_usd=5)
    workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("5"))
    workspace.daily_cost_budget_usd = 1
    workspace.save()

    assert tasks_readmit() == 0
    assert Task.objects.filter(workspace=workspace, status=Task.Status.DEFERRED).count() == 1
