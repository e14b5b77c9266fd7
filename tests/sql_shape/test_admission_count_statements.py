"""Admission reads its counts in one statement: the count rows by their key, no run or task."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from runs.services import admission_check
from runs.services.admission import (
    _active_runs_count,
    _admission_counts,
    _admission_counts_sql,
)
from runs.state import ACTIVE
from tests.factories import RepositoryFactory, TaskFactory, WorkspaceFactory
from tests.query_plans import query_plan

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_the_workspace_count_alone_reads_the_runs_workspace() -> None:
    workspace, other = WorkspaceFactory(), WorkspaceFactory()
    repositories = [RepositoryFactory(workspace=workspace) for _ in range(2)]
    for repository in [*repositories, RepositoryFactory(workspace=other)]:
        for status in [*sorted(ACTIVE), "completed", "cancelled"]:
            task = TaskFactory(workspace=repository.workspace, repository=repository)
            Run.objects.create(task=task, run_no=1, status=status)
    with CaptureQueriesContext(connection) as queries:
        counted = _admission_counts(workspace_id=workspace.pk, repository_id=None, spend=False)
    assert counted == (2 * len(ACTIVE), 0, Decimal("0"))
    assert "runs_task" not in queries.captured_queries[0]["sql"]
    assert (
        counted[0]
        == _active_runs_count(workspace_id=workspace.pk, repository_id=repositories[0].pk)[0]
    )


@pytest.mark.parametrize("per_repository", [False, True])
def test_both_counts_read_the_count_rows_by_their_key(per_repository: bool) -> None:
    """The count reads the workspace's (and the repository's) rows of the active-run
    counts through their primary key, and no run, task or other index."""
    workspace = WorkspaceFactory()
    repository = RepositoryFactory(workspace=workspace)
    Run.objects.create(task=TaskFactory(workspace=workspace, repository=repository), run_no=1)
    params: list[object] = [repository.pk] if per_repository else []
    params += [workspace.pk, date(2026, 1, 1), workspace.pk]
    params += [repository.pk] if per_repository else []
    plan = query_plan(_admission_counts_sql(True, per_repository), params)
    scans = [line for line in plan.splitlines() if "Scan" in line and "activeruncount" in line]
    assert len(scans) == 1 and "runs_activeruncount_pkey" in scans[0], plan
    assert "runs_run" not in plan and "runs_task" not in plan, plan


@pytest.mark.parametrize(("workspace_limit", "repository_limit"), [(5, 5), (5, 2)])
def test_admission_reads_no_task_and_filters_only_for_a_tighter_repository_limit(
    workspace_limit: int, repository_limit: int
) -> None:
    workspace = WorkspaceFactory(max_active_runs=workspace_limit)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=repository_limit)
    Run.objects.create(task=TaskFactory(workspace=workspace, repository=repository), run_no=1)
    with CaptureQueriesContext(connection) as queries:
        assert admission_check(workspace=workspace, repository=repository) is None
    sql = queries.captured_queries[0]["sql"]
    assert "runs_task" not in sql
    assert ("FILTER" in sql) == (repository_limit < workspace_limit)
