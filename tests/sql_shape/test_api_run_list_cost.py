"""The runs list costs the same few queries whatever the page, reads an index in its
order, and renders each run exactly as the run's own page does."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentplatform.api.views.runs import RunListApi, RunOutputSerializer
from runs.models import Membership, Run
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


def _runs(workspace, repository, n: int) -> list[Run]:
    return Run.objects.bulk_create(
        [
            Run(
                task=TaskFactory(workspace=workspace, repository=repository),
                workspace=workspace,
                repository=repository,
                run_no=1,
            )
            for _ in range(n)
        ]
    )


def test_each_listed_run_is_rendered_as_its_detail_renders_it(member) -> None:
    user, workspace, repository = member
    finished, running = _runs(workspace, repository, 2)
    now = timezone.now()
    Run.objects.filter(pk=finished.pk).update(
        status=Run.Status.COMPLETED,
        started_at=now - timedelta(seconds=90),
        finished_at=now,
        cost_usd=Decimal("0.125"),
        tokens_in=1200,
        attempt=7,
        branch="agent/fix",
        failure_reason="",
    )
    Run.objects.filter(pk=running.pk).update(
        status=Run.Status.RUNNING, cancel_requested_at=now, step_no=3
    )
    listed = {row["id"]: row for row in api_client_for(user).get("/api/runs/").json()["results"]}
    for run in Run.objects.select_related("task__workspace"):
        detail = dict(RunOutputSerializer(run).data)
        assert listed[str(run.pk)] == {
            key: str(value) if isinstance(value, uuid.UUID) else value
            for key, value in detail.items()
        }
    assert listed[str(finished.pk)]["lease_generation"] == 7
    assert listed[str(finished.pk)]["workspace"] == workspace.slug
    assert listed[str(finished.pk)]["task"] == str(finished.task_id)


def test_a_page_costs_the_same_queries_whatever_its_size(member) -> None:
    user, workspace, repository = member
    api = api_client_for(user)
    _runs(workspace, repository, 2)
    with CaptureQueriesContext(connection) as small:
        assert len(api.get("/api/runs/").json()["results"]) == 2
    _runs(workspace, repository, 60)
    with CaptureQueriesContext(connection) as full:
        assert len(api.get("/api/runs/").json()["results"]) == 50
    # The caller's workspaces, the bounded count, the page: nothing per run.
    assert len(small.captured_queries) == len(full.captured_queries) == 3


def _list_plans(user) -> tuple[str, str]:
    """The plans of the list's page and of its bounded count."""
    view = RunListApi()
    view.request = type("Request", (), {"user": user})()
    queryset = view.get_queryset()
    return query_plan(queryset[:50]), query_plan(queryset.values("pk")[:1050])


def test_the_list_query_reads_the_index_in_its_order_without_sorting(member) -> None:
    user, workspace, repository = member
    _runs(workspace, repository, 20)
    # One workspace: one range of the workspace's index, no join to the tasks.
    for plan in _list_plans(user):
        assert "run_ws_created" in plan, plan
        assert "Sort" not in plan and "runs_task" not in plan, plan
    # Several: the list's order over all runs, filtered by the run's own workspace.
    other = WorkspaceFactory()
    Membership.objects.create(workspace=other, user=user, role="member")
    _runs(other, RepositoryFactory(workspace=other), 3)
    page, count = _list_plans(user)
    assert "run_created" in page and "Sort" not in page and "runs_task" not in page, page
    assert "runs_task" not in count, count


def test_a_run_carries_its_tasks_workspace(member) -> None:
    _, workspace, repository = member
    run = Run.objects.create(task=TaskFactory(workspace=workspace, repository=repository), run_no=1)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    follow_up = Run(task=run.task, run_no=2)
    follow_up.save()
    assert run.workspace_id == follow_up.workspace_id == workspace.pk
    assert Run.objects.get(pk=run.pk).workspace_id == workspace.pk


def test_filters_and_scoping_still_apply(member) -> None:
    user, workspace, repository = member
    mine = _runs(workspace, repository, 3)
    other = WorkspaceFactory()
    _runs(other, RepositoryFactory(workspace=other), 2)
    Run.objects.filter(pk=mine[0].pk).update(status=Run.Status.FAILED)
    api = api_client_for(user)
    assert {r["id"] for r in api.get("/api/runs/").json()["results"]} == {
        str(run.pk) for run in mine
    }
    failed = api.get("/api/runs/?status=failed").json()
    assert [r["id"] for r in failed["results"]] == [str(mine[0].pk)]
    assert failed["count"] == 1
    by_task = api.get(f"/api/runs/?task={mine[1].task_id}").json()["results"]
    assert [r["id"] for r in by_task] == [str(mine[1].pk)]


def test_a_new_membership_is_seen_by_the_next_request(member) -> None:
    user, workspace, repository = member
    _runs(workspace, repository, 2)
    api = api_client_for(user)
    assert api.get("/api/runs/").json()["count"] == 2
    other = WorkspaceFactory()
    _runs(other, RepositoryFactory(workspace=other), 5)
    Membership.objects.create(workspace=other, user=user, role="member")
    assert api.get("/api/runs/").json()["count"] == 7
    Membership.objects.filter(user=user).delete()
    assert api.get("/api/runs/").json() == {
        "count": 0,
        "next": None,
        "previous": None,
        "results": [],
    }


def test_another_time_zone_renders_the_list_as_the_detail(member) -> None:
    user, workspace, repository = member
    (run,) = _runs(workspace, repository, 1)
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now())
    api = api_client_for(user)
    with timezone.override("Asia/Kolkata"):
        listed = api.get("/api/runs/").json()["results"][0]
        detail = api.get(f"/api/runs/{run.pk}/").json()
    assert listed["started_at"].endswith("+05:30")
    assert listed["started_at"] == detail["started_at"]


def test_indented_json_is_the_same_list(member) -> None:
    user, workspace, repository = member
    _runs(workspace, repository, 3)
    api = api_client_for(user)
    compact = api.get("/api/runs/")
    indented = api.get("/api/runs/", HTTP_ACCEPT="application/json; indent=2")
    assert indented.json() == compact.json()
    assert b'\n  "results": [\n' in indented.content
    assert b"\n" not in compact.content
