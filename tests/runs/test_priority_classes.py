"""Priority classes: validated on every way in, aged while waiting, re-admitted in
effective order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from runs import priorities
from runs.models import Task
from runs.services import CommandRefused, task_submit, tasks_readmit
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_classes_by_name_or_number_and_nothing_else() -> None:
    assert priorities.parse("security") == 10
    assert priorities.parse("500") == 500
    assert priorities.parse(0) == 0
    for wrong in (1, -5, "urgent", 99, True, None):
        with pytest.raises(priorities.PriorityInvalid):
            priorities.parse(wrong)


def test_aging_one_step_per_thirty_minutes_waited() -> None:
    start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    with time_machine.travel(start, tick=False) as clock:
        assert priorities.effective(500, start) == 500
        clock.shift(timedelta(minutes=29, seconds=59))
        assert priorities.effective(500, start) == 500
        clock.shift(timedelta(seconds=1))
        assert priorities.effective(500, start) == 499
        clock.shift(timedelta(hours=199, minutes=30))
        assert priorities.effective(500, start) == 100
        clock.shift(timedelta(hours=300))
        assert priorities.effective(500, start) == -500  # more urgent than an emergency


def test_broker_priority_orders_classes_then_shares() -> None:
    order = [
        priorities.broker_priority(p, under_share=u)
        for p in (0, 10, 50, 100, 200)
        for u in (True, False)
    ]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert priorities.broker_priority(-40) == priorities.broker_priority(0)
    assert priorities.broker_priority(500) == priorities.broker_priority(200)


def test_labels_name_the_class() -> None:
    assert priorities.from_labels(["bug", "agent:priority:security"]) == 10
    assert priorities.from_labels(["agent:priority:batch", "agent:priority:emergency"]) == 0
    assert priorities.from_labels(["agent:priority:whenever", "agent"]) is None


def test_repository_default_and_refusal() -> None:
    repository = RepositoryFactory(default_priority=priorities.BATCH)
    task = task_submit(workspace=repository.workspace, repository=repository, instruction="x").task
    assert task.priority == priorities.BATCH
    named = task_submit(
        workspace=repository.workspace, repository=repository, instruction="y", priority="security"
    ).task
    assert named.priority == priorities.SECURITY
    with pytest.raises(CommandRefused) as refused:
        task_submit(
            workspace=repository.workspace, repository=repository, instruction="z", priority=7
        )
    assert refused.value.code == "priority_invalid"


def test_readmission_takes_the_aged_maintenance_task_before_newer_normal_ones() -> None:
    workspace = WorkspaceFactory(max_active_runs=1)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=5)
    first = task_submit(workspace=workspace, repository=repository, instruction="busy").task
    old = task_submit(
        workspace=workspace, repository=repository, instruction="old", priority="maintenance"
    ).task
    normal = [
        task_submit(workspace=workspace, repository=repository, instruction=f"n{i}").task
        for i in range(3)
    ]
    assert {t.status for t in [old, *normal]} == {Task.Status.DEFERRED}
    # 201 hours waited: 500 - 402 = 98, more urgent than normal (100).
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=201))
    first.runs.update(status="completed")
    assert tasks_readmit(workspace_id=workspace.pk) == 1
    old.refresh_from_db()
    assert old.status == Task.Status.RUNNING
    assert all(Task.objects.get(pk=t.pk).status == Task.Status.DEFERRED for t in normal)


def test_readmission_without_aging_is_class_then_age() -> None:
    workspace = WorkspaceFactory(max_active_runs=1)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=5)
    first = task_submit(workspace=workspace, repository=repository, instruction="busy").task
    task_submit(workspace=workspace, repository=repository, instruction="m", priority=500)
    security = task_submit(
        workspace=workspace, repository=repository, instruction="s", priority=10
    ).task
    first.runs.update(status="completed")
    assert tasks_readmit(workspace_id=workspace.pk) == 1
    assert Task.objects.get(pk=security.pk).status == Task.Status.RUNNING
