"""A workspace's daily cost budget holds its model spend of the UTC day: the spend is a
running total kept with each stored model turn, read by admission as one row."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum

from runs import demo
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run, WorkspaceSpend
from runs.services import task_submit
from runs.services.admission import admission_check
from runs.spend import workspace_spend_add, workspace_spend_today
from tests.factories import RepositoryFactory, TaskFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = "workspace spent its daily budget of $1"


@pytest.fixture
def budgeted():
    workspace = WorkspaceFactory(max_active_runs=1000, daily_cost_budget_usd=Decimal("1"))
    return workspace, RepositoryFactory(workspace=workspace, max_active_runs=1000)


def _submit(repository) -> str:
    return task_submit(
        workspace=repository.workspace, repository=repository, instruction="Fix it"
    ).task.status


def test_a_run_spends_what_its_stored_turns_cost(workspace, repository) -> None:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted-priced", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)
    # A duplicated wake-up of the finished run records nothing more.
    run_drive_inline(run_id=run.id)

    turns = ModelTurn.objects.filter(run=run).aggregate(total=Sum("cost_usd"))["total"]
    assert turns > 0
    assert workspace_spend_today(workspace_id=workspace.pk) == turns == run.cost_usd


def test_a_turn_stored_twice_counts_once(workspace) -> None:
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    with transaction.atomic():
        ModelTurn.objects.create(run=run, step_no=1, turn_no=1, cost_usd=Decimal("0.25"))
        workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.25"))
    # A second attempt at the same turn fails on the turn's unique key and takes its
    # spend down with it.
    with pytest.raises(IntegrityError), transaction.atomic():
        workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.25"))
        ModelTurn.objects.create(run=run, step_no=1, turn_no=1, cost_usd=Decimal("0.25"))
    assert workspace_spend_today(workspace_id=workspace.pk) == Decimal("0.25")


def test_concurrent_turns_add_up_exactly(workspace) -> None:
    start = threading.Barrier(8)

    def spend() -> None:
        try:
            start.wait()
            for _ in range(10):
                with transaction.atomic():
                    workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.001"))
        finally:
            connection.close()

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert workspace_spend_today(workspace_id=workspace.pk) == Decimal("0.080")
    assert WorkspaceSpend.objects.filter(workspace=workspace).count() == 1


def test_spend_counts_once_committed_and_then_refuses_at_the_budget(budgeted) -> None:
    workspace, repository = budgeted
    workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.99"))
    added, release = threading.Event(), threading.Event()

    def turn_over_budget() -> None:
        try:
            with transaction.atomic():
                workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.02"))
                added.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=turn_over_budget)
    thread.start()
    try:
        assert added.wait(10)
        # The turn holds the total's row until it commits; admission neither waits for
        # it nor counts it yet.
        assert _submit(repository) == "running"
    finally:
        release.set()
        thread.join()
    assert _submit(repository) == "deferred"
    assert admission_check(workspace=workspace, repository=repository) == REFUSED


def test_the_budget_starts_afresh_at_midnight_utc(budgeted) -> None:
    workspace, repository = budgeted
    evening = dt.datetime(2026, 3, 1, 23, 59, 59, 900_000, tzinfo=dt.UTC)
    with time_machine.travel(evening, tick=False):
        workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("1"))
        assert admission_check(workspace=workspace, repository=repository) == REFUSED
    with time_machine.travel(evening + dt.timedelta(milliseconds=100), tick=False):
        assert admission_check(workspace=workspace, repository=repository) is None
        # A run started the day before spends on the day its turns are stored.
        workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("1"))
        assert admission_check(workspace=workspace, repository=repository) == REFUSED
    assert {(row.day, row.cost_usd) for row in WorkspaceSpend.objects.all()} == {
        (dt.date(2026, 3, 1), Decimal("1")),
        (dt.date(2026, 3, 2), Decimal("1")),
    }
