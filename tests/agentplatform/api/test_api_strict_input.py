"""Write endpoints refuse what they do not understand: unknown fields (400 naming them)
and oversized bodies (413), as problem details, changing nothing."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client
from rest_framework.test import APIClient

from agentplatform.api.auth import api_token_issue
from jobs.models import DeadLetter
from runs.models import ApiToken, Membership, Repository, Run, Task, Workspace
from tests.factories import (
    DeadLetterFactory,
    RepositoryFactory,
    RunFactory,
    TaskFactory,
    UserFactory,
    WorkspaceFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user(workspace):
    user = UserFactory(is_staff=True, username="ada")
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.ADMIN)
    return user


@pytest.fixture
def client(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


def _assert_unknown(response, *names):
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    errors = response.json()["errors"]
    assert sorted(errors) == sorted(names)
    for name in names:
        assert errors[name][0].startswith("unknown field")


def test_misspelled_task_fields_are_refused_and_no_task_runs(client, workspace):
    repository = RepositoryFactory(workspace=workspace)

    response = client.post(
        "/api/tasks/",
        {
            "repository": repository.pk,
            "instruction": "Fix add()",
            "executionMode": "supervised_pr",
            "risk": "high",
        },
        format="json",
    )

    _assert_unknown(response, "executionMode", "risk")
    assert "execution_mode" in response.json()["errors"]["risk"][0]
    assert Task.objects.count() == 0 and Run.objects.count() == 0


def test_read_only_fields_cannot_be_written_on_submission(client, workspace):
    repository = RepositoryFactory(workspace=workspace)

    response = client.post(
        "/api/tasks/",
        {"repository": repository.pk, "instruction": "x", "status": "completed", "usage": {}},
        format="json",
    )

    _assert_unknown(response, "status", "usage")
    assert Task.objects.count() == 0


def test_every_write_endpoint_names_unknown_fields(client, workspace, admin_user):
    repository = RepositoryFactory(workspace=workspace)
    run = RunFactory(task=TaskFactory(workspace=workspace, repository=repository))
    letter = DeadLetterFactory()
    token = ApiToken.objects.get(pk=api_token_issue(user=admin_user)[0].pk)
    junk = {"bogus": 1}
    cases = [
        ("post", "/api/workspaces/", {"slug": "new", "name": "New", **junk}),
        ("patch", f"/api/workspaces/{workspace.slug}/", {"name": "Renamed", **junk}),
        (
            "post",
            f"/api/workspaces/{workspace.slug}/members/",
            {"username": admin_user.username, **junk},
        ),
        (
            "post",
            "/api/repositories/",
            {"workspace": workspace.slug, "name": "r2", "clone_url": "https://x/y.git", **junk},
        ),
        ("patch", f"/api/repositories/{repository.pk}/", {"name": "renamed", **junk}),
        ("post", "/api/tokens/", {"name": "ci", **junk}),
        ("post", f"/api/runs/{run.pk}/cancel/", {"reason": "no", **junk}),
        ("post", f"/api/runs/{run.pk}/approve/", {"comment": "ok", **junk}),
        ("post", f"/api/runs/{run.pk}/reject/", {"comment": "no", **junk}),
        ("post", f"/api/runs/{run.pk}/retry/", junk),
        ("post", f"/api/dead-letters/{letter.pk}/requeue/", junk),
        ("post", f"/api/dead-letters/{letter.pk}/discard/", junk),
    ]
    for method, path, body in cases:
        response = getattr(client, method)(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert "bogus" in response.json()["errors"], path

    workspace.refresh_from_db()
    run.refresh_from_db()
    letter.refresh_from_db()
    token.refresh_from_db()
    assert Workspace.objects.count() == 1 and workspace.name != "Renamed"
    assert Repository.objects.count() == 1 and repository.name != "renamed"
    assert ApiToken.objects.count() == 1
    assert run.cancel_requested_at is None and Run.objects.count() == 1
    assert letter.status == DeadLetter.Status.OPEN


@pytest.mark.parametrize("megabytes", [3, 30])
def test_oversized_body_is_413_problem_without_a_traceback(
    megabytes, admin_user, workspace, caplog
):
    repository = RepositoryFactory(workspace=workspace)
    secret = api_token_issue(user=admin_user)[1]
    body = json.dumps({"repository": repository.pk, "instruction": "x" * (megabytes * 1024 * 1024)})

    with caplog.at_level(logging.INFO):
        response = Client().post(
            "/api/tasks/",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )

    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "payload_too_large"
    assert Task.objects.count() == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_body_under_the_limit_is_accepted(client, workspace, settings):
    settings.API_MAX_BODY_BYTES = 4096
    repository = RepositoryFactory(workspace=workspace)

    small = client.post(
        "/api/tasks/", {"repository": repository.pk, "instruction": "x" * 100}, format="json"
    )
    large = client.post(
        "/api/tasks/", {"repository": repository.pk, "instruction": "x" * 5000}, format="json"
    )

    assert (small.status_code, large.status_code) == (202, 413)


def test_unknown_workspace_member_fields_do_not_touch_other_workspaces(client):
    other = WorkspaceFactory()

    response = client.patch(f"/api/workspaces/{other.slug}/", {"bogus": 1}, format="json")

    assert response.status_code == 404
