"""Limits per task type: over one a task is deferred, and re-admitted when a run of its
type ends; concurrent submissions and run ends never admit past it, nor one task twice."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from runs.models import Run, Task
from runs.services import run_after_terminal, task_submit
from runs.state import ACTIVE
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(repository: Any, task_type: str, n: int = 0) -> Task:
    return task_submit(
        workspace=repository.workspace,
        repository=repository,
        instruction=f"{task_type} {n}",
        task_type=task_type,
    ).task


def _end(task: Task) -> None:
    run = task.runs.get()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    run_after_terminal(run_id=run.pk)


def test_workspace_type_limit_defers_and_readmits() -> None:
    workspace = WorkspaceFactory(max_active_runs=50, task_type_limits={"dependency_upgrade": 2})
    repository = RepositoryFactory(workspace=workspace, max_active_runs=50)
    upgrades = [_submit(repository, "dependency_upgrade", i) for i in range(4)]
    other = _submit(repository, "change")
    assert [t.status for t in upgrades] == ["running", "running", "deferred", "deferred"]
    assert "2 active dependency_upgrade runs" in upgrades[2].status_reason
    assert other.status == "running"  # other types are not held back
    _end(other)
    assert Task.objects.get(pk=upgrades[2].pk).status == "deferred"
    _end(upgrades[0])
    statuses = [Task.objects.get(pk=t.pk).status for t in upgrades]
    assert statuses == ["running", "running", "running", "deferred"]


def test_repository_type_limit() -> None:
    workspace = WorkspaceFactory(max_active_runs=50)
    limited = RepositoryFactory(
        workspace=workspace, max_active_runs=50, task_type_limits={"dependency_upgrade": 1}
    )
    free = RepositoryFactory(workspace=workspace, max_active_runs=50)
    first, second = (_submit(limited, "dependency_upgrade", i) for i in range(2))
    elsewhere = _submit(free, "dependency_upgrade")
    assert (first.status, second.status, elsewhere.status) == ("running", "deferred", "running")
    _end(first)
    assert Task.objects.get(pk=second.pk).status == "running"


def _threads(target: Any, n: int) -> None:
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_concurrent_submissions_never_pass_the_limit() -> None:
    workspace = WorkspaceFactory(max_active_runs=100, task_type_limits={"dependency_upgrade": 3})
    repository = RepositoryFactory(workspace=workspace, max_active_runs=100)
    _threads(lambda i: _submit(repository, "dependency_upgrade", i), 12)
    active = Run.objects.filter(workspace=workspace, status__in=ACTIVE)
    assert active.count() == 3
    assert Task.objects.filter(workspace=workspace, status="deferred").count() == 9


def test_concurrent_run_ends_admit_each_task_once() -> None:
    workspace = WorkspaceFactory(max_active_runs=6)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=100)
    first = [_submit(repository, "change", i) for i in range(6)]
    deferred = [_submit(repository, "change", 100 + i) for i in range(10)]
    assert all(t.status == "deferred" for t in deferred)
    _threads(lambda i: _end(first[i]), 6)
    runs = Run.objects.filter(task__in=deferred)
    assert runs.count() == 6
    assert len({r.task_id for r in runs}) == 6  # no task admitted twice
    assert Run.objects.filter(workspace=workspace, status__in=ACTIVE).count() == 6
