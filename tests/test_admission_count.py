"""Admission's count of active runs agrees with the ORM's reading of the same rows:
every active status counts, finished runs and other workspaces' runs do not."""

from __future__ import annotations

import pytest
from django.db.models import Count, Q

from runs.models import Run
from runs.services import _active_runs_count
from runs.state import ACTIVE
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
