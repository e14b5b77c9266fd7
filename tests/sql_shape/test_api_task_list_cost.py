"""The task list costs the same few queries whatever the page, reads an index in its
order, and renders each task exactly as the task's own page does."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentplatform.api.views.tasks import TaskCollectionApi, TaskOutputSerializer
from runs.models import Task
from tests.factories import (
    RepositoryFactory,
    TaskFactory,
    WorkspaceFactory,
    api_client_for,
    member_with_repository,
)
from tests.query_plans import query_plan

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


@pytest.fixture
def member():
    return member_with_repository()


def _tasks(workspace, repository, n: int) -> list[Task]:
    return [TaskFactory(workspace=workspace, repository=repository) for _ in range(n)]


def test_each_listed_task_is_rendered_as_its_detail_renders_it(member) -> None:
    user, workspace, repository = member
    plain, detailed = _tasks(workspace, repository, 2)
    Task.objects.filter(pk=detailed.pk).update(
        status=Task.Status.DEFERRED,
        status_reason="workspace at its limit",
        budget={"cost_usd": 0.5},
        usage={"model_turns": 3},
        priority=200,
        target_branch="release",
    )
    listed = {row["id"]: row for row in api_client_for(user).get("/api/tasks/").json()["results"]}
    for task in Task.objects.select_related("workspace"):
        detail = dict(TaskOutputSerializer(task).data)
        assert listed[str(task.pk)] == {
            key: str(value) if isinstance(value, uuid.UUID) else value
            for key, value in detail.items()
        }
    assert listed[str(detailed.pk)]["workspace"] == workspace.slug
    assert listed[str(detailed.pk)]["repository"] == repository.pk
    assert listed[str(detailed.pk)]["budget"] == {"cost_usd": 0.5}
    assert listed[str(plain.pk)]["status"] == plain.status


def test_a_page_costs_the_same_queries_whatever_its_size(member) -> None:
    user, workspace, repository = member
    api = api_client_for(user)
    _tasks(workspace, repository, 2)
    with CaptureQueriesContext(connection) as small:
        assert len(api.get("/api/tasks/").json()["results"]) == 2
    _tasks(workspace, repository, 60)
    with CaptureQueriesContext(connection) as full:
        assert len(api.get("/api/tasks/").json()["results"]) == 50
    # The caller's workspaces, the bounded count, the page: nothing per task.
    assert len(small.captured_queries) == len(full.captured_queries) == 3
    page = full.captured_queries[-1]["sql"]
    assert "runs_workspace" in page  # the slug, joined into the page's one query


def test_the_list_query_reads_the_index_in_its_order_without_sorting(member) -> None:
    user, workspace, repository = member
    _tasks(workspace, repository, 20)
    view = TaskCollectionApi()
    view.request = type("Request", (), {"user": user})()
    plan = query_plan(view.get_queryset()[:50])
    assert "task_created" in plan, plan
    assert "Sort" not in plan, plan


def test_filters_and_scoping_still_apply(member) -> None:
    user, workspace, repository = member
    mine = _tasks(workspace, repository, 3)
    other = WorkspaceFactory()
    _tasks(other, RepositoryFactory(workspace=other), 2)
    Task.objects.filter(pk=mine[0].pk).update(status=Task.Status.FAILED)
    api = api_client_for(user)
    assert {t["id"] for t in api.get("/api/tasks/").json()["results"]} == {
        str(task.pk) for task in mine
    }
    failed = api.get("/api/tasks/?status=failed").json()
    assert [t["id"] for t in failed["results"]] == [str(mine[0].pk)]
    assert failed["count"] == 1
    by_workspace = api.get(f"/api/tasks/?workspace={workspace.slug}").json()
    assert by_workspace["count"] == 3
    assert api.get(f"/api/tasks/?workspace={other.slug}").json()["count"] == 0
