"""POST /api/tasks/: 202 with ids, idempotent replays, 422 on a reused key, 400 on junk."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from runs.models import Membership, Run, Task
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_client(workspace):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.MEMBER)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def repo(workspace):
    return RepositoryFactory(workspace=workspace)


def _submit(client, body, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post("/api/tasks/", body, format="json", **headers)


def test_submission_answers_202_with_task_run_and_status(member_client, repo):
    response = _submit(member_client, {"repository": repo.pk, "instruction": "Fix add()"})

    assert response.status_code == 202, response.content
    body = response.json()
    task = Task.objects.get()
    assert body == {
        "task_id": str(task.id),
        "run_id": str(task.runs.get().id),
        "status": "queued",
        "reason": None,
    }
    assert response["Location"] == f"/api/tasks/{task.id}/"
    assert task.source == Task.Source.API


def test_submission_over_the_limit_is_deferred_with_the_reason(member_client, workspace, repo):
    workspace.max_active_runs = 0
    workspace.save()

    body = _submit(member_client, {"repository": repo.pk, "instruction": "Fix add()"}).json()

    assert body["status"] == "deferred"
    assert body["run_id"] is None
    assert "limit" in body["reason"]


def test_same_key_and_body_returns_the_original_response(member_client, repo):
    request = {"repository": repo.pk, "instruction": "Fix add()", "priority": 10}
    first = _submit(member_client, request, key="abc-1")
    # The task moves on; the replay still answers what the submission answered.
    Run.objects.update(status=Run.Status.FAILED)
    replay = _submit(member_client, request, key="abc-1")

    assert replay.status_code == 202
    assert replay.json() == first.json()
    assert Task.objects.count() == 1


def test_replay_of_a_deferred_submission_keeps_status_and_reason(member_client, workspace, repo):
    workspace.max_active_runs = 0
    workspace.save()
    request = {"repository": repo.pk, "instruction": "Fix add()"}
    first = _submit(member_client, request, key="k-deferred")
    Task.objects.update(status=Task.Status.CANCELLED, status_reason="")

    replay = _submit(member_client, request, key="k-deferred")

    assert replay.json() == first.json()


def test_same_key_with_a_different_body_is_422(member_client, repo):
    _submit(member_client, {"repository": repo.pk, "instruction": "Fix add()"}, key="abc-2")

    response = _submit(member_client, {"repository": repo.pk, "instruction": "Other"}, key="abc-2")

    assert response.status_code == 422
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_key_reused"
    assert Task.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"instruction": "Fix"}, "repository"),
        ({"repository": "REPO", "instruction": "   "}, "instruction"),
        ({"repository": "REPO", "instruction": "Fix", "execution_mode": "yolo"}, "execution_mode"),
        ({"repository": "REPO", "instruction": "Fix", "budget": {"coffee": 1}}, "budget"),
    ],
)
def test_invalid_input_is_400_with_field_errors_and_creates_nothing(
    member_client, repo, body, field
):
    body = {k: (repo.pk if v == "REPO" else v) for k, v in body.items()}

    response = _submit(member_client, body, key="k-invalid")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert field in response.json()["errors"]
    assert Task.objects.count() == 0
    assert Run.objects.count() == 0


def test_a_repository_of_another_workspace_is_an_unknown_repository(member_client):
    foreign = RepositoryFactory(workspace=WorkspaceFactory())

    response = _submit(member_client, {"repository": foreign.pk, "instruction": "Fix"})
    missing = _submit(member_client, {"repository": 10**9, "instruction": "Fix"})

    # Well-formed but naming nothing the caller can see: 422, alike for both.
    assert (response.status_code, missing.status_code) == (422, 422)
    assert response.json()["code"] == "unresolved_reference"
    assert "repository" in response.json()["errors"]
    assert response.json()["errors"] == missing.json()["errors"] | {
        "repository": response.json()["errors"]["repository"]
    }
    assert Task.objects.count() == 0


def test_task_list_filters_by_status_source_repository_and_created_range(
    member_client, workspace, repo
):
    other_repo = RepositoryFactory(workspace=workspace)
    for repository in (repo, repo, other_repo):
        _submit(member_client, {"repository": repository.pk, "instruction": "Fix"})
    Task.objects.filter(repository=other_repo).update(status=Task.Status.COMPLETED)
    first = Task.objects.order_by("created_at").first()

    def ids(query):
        response = member_client.get(f"/api/tasks/{query}")
        assert response.status_code == 200, response.content
        return {item["id"] for item in response.json()["results"]}

    assert len(ids("")) == 3
    assert len(ids(f"?repository={repo.pk}")) == 2
    assert len(ids("?status=completed")) == 1
    assert len(ids("?source=webhook")) == 0
    Task.objects.filter(pk=first.pk).update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    assert ids("?created_before=2021-01-01T00:00:00Z") == {str(first.id)}
    assert len(ids("?created_after=2021-01-01T00:00:00Z")) == 2
    assert member_client.get("/api/tasks/?status=bogus").status_code == 400


def test_created_range_takes_any_iso_offset_and_refuses_what_leaves_the_calendar(
    member_client, workspace, repo
):
    _submit(member_client, {"repository": repo.pk, "instruction": "Fix"})
    Task.objects.update(created_at=datetime(2020, 1, 1, 12, tzinfo=UTC))
    Run.objects.update(created_at=datetime(2020, 1, 1, 12, tzinfo=UTC))

    # ISO 8601 allows offsets PostgreSQL does not (it stops at 15:59): same instant in UTC.
    for url in ("/api/tasks/", "/api/runs/"):
        inside = member_client.get(f"{url}?created_before=2020-01-02T07:09:00%2B18:09")
        assert inside.status_code == 200, inside.content
        assert len(inside.json()["results"]) == 1
        outside = member_client.get(f"{url}?created_after=2020-01-02T07:09:00%2B18:09")
        assert (outside.status_code, len(outside.json()["results"])) == (200, 0)

        beyond = member_client.get(f"{url}?created_after=9999-12-31T23:00:00-18:00")
        assert beyond.status_code == 400, beyond.content
        assert "created_after" in beyond.content.decode()
