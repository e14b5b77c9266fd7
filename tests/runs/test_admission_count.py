"""Admission's count of active runs agrees with the ORM's reading of the same rows:
every active status counts, finished runs and other workspaces' runs do not. When the
repository's limit is not below the workspace's, only the workspace's runs are counted
(by the workspace each run carries) and admission answers the same."""

from __future__ import annotations

import pytest
from django.db.models import Count, Q

from runs.models import RUN_TERMINAL_STATUSES, Run
from runs.services.admission import (
    _active_runs_count,
    _admission_counts,
    admission_check,
)
from runs.state import ACTIVE, TERMINAL
from tests.factories import RepositoryFactory, TaskFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


def test_active_runs_are_counted_per_workspace_and_per_repository() -> None:
    workspace, other = WorkspaceFactory(), WorkspaceFactory()
    mine, sibling = RepositoryFactory(workspace=workspace), RepositoryFactory(workspace=workspace)
    elsewhere = RepositoryFactory(workspace=other)
    statuses = [*sorted(ACTIVE), "completed", "failed", "cancelled"]
    for repository in (mine, sibling, sibling, elsewhere):
        for status in statuses:
            task = TaskFactory(workspace=repository.workspace, repository=repository)
            Run.objects.create(task=task, run_no=1, status=status)

    counts = Run.objects.filter(task__workspace=workspace, status__in=ACTIVE).aggregate(
        workspace=Count("pk"), repository=Count("pk", filter=Q(task__repository=mine))
    )
    assert _active_runs_count(workspace_id=workspace.pk, repository_id=mine.pk) == (
        counts["workspace"],
        counts["repository"],
    )
    assert counts == {"workspace": 3 * len(ACTIVE), "repository": len(ACTIVE)}


@pytest.mark.parametrize(
    ("workspace_limit", "repository_limit", "active", "refusal"),
    [
        (3, 3, 2, None),
        (3, 5, 3, "workspace at its limit of 3 active runs"),
        (3, 3, 3, "workspace at its limit of 3 active runs"),
        (5, 2, 2, "repository at its limit of 2 active runs"),
        (5, 2, 1, None),
        # More active runs than the limit (a limit lowered under a full queue): the
        # count stops at the limit and still refuses.
        (3, 5, 7, "workspace at its limit of 3 active runs"),
        (5, 2, 4, "repository at its limit of 2 active runs"),
    ],
)
def test_admission_answers_alike_whichever_count_it_reads(
    workspace_limit: int, repository_limit: int, active: int, refusal: str | None
) -> None:
    workspace = WorkspaceFactory(max_active_runs=workspace_limit)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=repository_limit)
    for _ in range(active):
        Run.objects.create(task=TaskFactory(workspace=workspace, repository=repository), run_no=1)
    assert admission_check(workspace=workspace, repository=repository) == refusal


def test_the_counts_are_the_triggers_exact_sums() -> None:
    """The counts are the triggers' sums, which cost the same however many runs are
    active, and are exact for the workspace and for the repository."""
    workspace = WorkspaceFactory()
    mine, sibling = RepositoryFactory(workspace=workspace), RepositoryFactory(workspace=workspace)
    for repository, active in ((mine, 4), (sibling, 3)):
        for _ in range(active):
            task = TaskFactory(workspace=workspace, repository=repository)
            Run.objects.create(task=task, run_no=1)
    assert _active_runs_count(workspace_id=workspace.pk, repository_id=mine.pk) == (7, 4)
    assert _admission_counts(workspace_id=workspace.pk, repository_id=mine.pk, spend=False)[:2] == (
        7,
        4,
    )
    assert _admission_counts(workspace_id=workspace.pk, repository_id=None, spend=False)[:2] == (
        7,
        0,
    )


def test_a_run_carries_its_tasks_repository() -> None:
    workspace = WorkspaceFactory()
    repository = RepositoryFactory(workspace=workspace)
    task = TaskFactory(workspace=workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1)
    assert Run.objects.filter(pk=run.pk).values_list("workspace", "repository").get() == (
        workspace.pk,
        repository.pk,
    )


def test_the_active_runs_index_holds_the_active_statuses() -> None:
    assert frozenset(RUN_TERMINAL_STATUSES) == TERMINAL
    assert frozenset(Run.Status.values) - TERMINAL == ACTIVE
