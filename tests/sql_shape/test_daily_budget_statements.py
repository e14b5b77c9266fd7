"""The daily budget check reads one row of the day's spend, by its index, and no runs."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run, WorkspaceSpend
from runs.services import admission_check
from runs.services.admission import _admission_counts
from runs.spend import workspace_spend_add, workspace_spend_today
from tests.factories import RepositoryFactory, TaskFactory, WorkspaceFactory
from tests.query_plans import query_plan

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]


@pytest.fixture
def budgeted():
    workspace = WorkspaceFactory(max_active_runs=1000, daily_cost_budget_usd=Decimal("1"))
    return workspace, RepositoryFactory(workspace=workspace, max_active_runs=1000)


def test_the_budget_check_reads_one_row_of_the_spend_and_no_runs(budgeted) -> None:
    workspace, repository = budgeted
    Run.objects.bulk_create(
        Run(
            task=TaskFactory(workspace=workspace, repository=repository),
            workspace=workspace,
            repository=repository,
            run_no=1,
        )
        for _ in range(30)
    )
    workspace_spend_add(workspace_id=workspace.pk, cost=Decimal("0.5"))
    with CaptureQueriesContext(connection) as queries:
        assert admission_check(workspace=workspace, repository=repository) is None
    # The active-run count and the day's total in one statement: the day's row by its
    # key, not the runs of the day.
    (statement,) = [q["sql"] for q in queries.captured_queries]
    assert statement.count("runs_workspacespend") == 1, statement
    assert "created_at" not in statement and "cost_usd" in statement, statement
    assert _admission_counts(
        workspace_id=workspace.pk, repository_id=repository.pk, spend=True
    ) == (30, 30, workspace_spend_today(workspace_id=workspace.pk))
    assert _admission_counts(
        workspace_id=WorkspaceFactory().pk, repository_id=repository.pk, spend=True
    ) == (0, 0, Decimal("0"))

    day = dt.datetime.now(dt.UTC).date()
    query = WorkspaceSpend.objects.filter(workspace_id=workspace.pk, day=day).values_list(
        "cost_usd", flat=True
    )[:1]
    plan = query_plan(query)
    assert "workspace_spend_day" in plan, plan
