"""Two workspaces; member, admin, outsider and anonymous against every endpoint.

Another workspace's object answers 404 (never 403, never data); a member lacking the
admin role gets 403 on admin operations of their own workspace; anonymous gets 401.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import DeadLetter
from runs.models import Artifact, Membership, Run
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory
from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db

ROLES = ("member", "admin", "outsider", "anon")


@dataclass
class World:
    ids: dict[str, Any]
    clients: dict[str, APIClient]


@pytest.fixture
def world() -> World:
    ws_a, ws_b = WorkspaceFactory(slug="alpha"), WorkspaceFactory(slug="beta")
    users = {"member": UserFactory(), "admin": UserFactory(), "outsider": UserFactory()}
    Membership.objects.create(workspace=ws_a, user=users["member"], role="member")
    Membership.objects.create(workspace=ws_a, user=users["admin"], role="admin")
    Membership.objects.create(workspace=ws_b, user=users["outsider"], role="member")
    repo = RepositoryFactory(workspace=ws_a, provider="github", external_id="octo/alpha")
    spare_repo = RepositoryFactory(workspace=ws_a, provider="github")
    task = TaskFactory(workspace=ws_a, repository=repo)
    run = Run.objects.create(task=task, run_no=1)
    artifact = Artifact.objects.create(
        run=run, kind="log", name="log", content="x", sha256="0" * 64
    )
    now = timezone.now()
    letter = DeadLetter.objects.create(
        task_name="runs.step",
        args=[str(run.id), 0],
        exception="boom",
        first_failed_at=now,
        last_failed_at=now,
        workspace_id=ws_a.pk,
    )
    receipt = WebhookReceipt.objects.create(
        provider="github",
        delivery_id=str(uuid.uuid4()),
        event="issues",
        payload={"repository": {"full_name": "octo/alpha"}},
        repository_ids=[repo.pk],
    )
    clients = {}
    for role in ROLES:
        client = APIClient()
        if role != "anon":
            client.force_authenticate(users[role])
        clients[role] = client
    ids = {
        "repo": repo.pk,
        "spare_repo": spare_repo.pk,
        "task": task.pk,
        "run": run.pk,
        "artifact": artifact.pk,
        "letter": letter.pk,
        "receipt": receipt.pk,
        "ws": ws_a.slug,
        "member_name": users["member"].username,
    }
    return World(ids=ids, clients=clients)


# (method, path, body, expected status for member, admin, outsider, anon)
MATRIX: list[tuple[str, str, dict[str, Any] | None, tuple[int, int, int, int]]] = [
    ("get", "/api/tasks/{task}/", None, (200, 200, 404, 401)),
    ("post", "/api/tasks/", {"repository": "{repo}", "instruction": "Fix"}, (202, 202, 422, 401)),
    ("get", "/api/runs/{run}/", None, (200, 200, 404, 401)),
    ("get", "/api/runs/{run}/events/", None, (200, 200, 404, 401)),
    ("get", "/api/runs/{run}/artifacts/", None, (200, 200, 404, 401)),
    ("get", "/api/runs/{run}/artifacts/{artifact}/", None, (200, 200, 404, 401)),
    ("post", "/api/runs/{run}/cancel/", {}, (202, 202, 404, 401)),
    ("post", "/api/runs/{run}/approve/", {}, (409, 409, 404, 401)),
    ("post", "/api/runs/{run}/reject/", {}, (409, 409, 404, 401)),
    ("post", "/api/runs/{run}/retry/", None, (409, 409, 404, 401)),
    ("get", "/api/workspaces/{ws}/", None, (200, 200, 404, 401)),
    ("patch", "/api/workspaces/{ws}/", {"name": "Alpha"}, (403, 200, 404, 401)),
    ("get", "/api/workspaces/{ws}/members/", None, (200, 200, 404, 401)),
    (
        "post",
        "/api/workspaces/{ws}/members/",
        {"username": "{member_name}", "role": "member"},
        (403, 200, 404, 401),
    ),
    ("delete", "/api/workspaces/{ws}/members/{member_name}/", None, (403, 204, 404, 401)),
    ("get", "/api/repositories/{repo}/", None, (200, 200, 404, 401)),
    ("patch", "/api/repositories/{repo}/", {"default_branch": "trunk"}, (403, 200, 404, 401)),
    ("delete", "/api/repositories/{spare_repo}/", None, (403, 204, 404, 401)),
    (
        "post",
        "/api/repositories/",
        {
            "workspace": "{ws}",
            "name": "new",
            "provider": "github",
            "clone_url": "https://example.com/x.git",
        },
        (403, 201, 422, 401),
    ),
    ("get", "/api/dead-letters/{letter}/", None, (200, 200, 404, 401)),
    ("post", "/api/dead-letters/{letter}/requeue/", None, (403, 202, 404, 401)),
    ("post", "/api/dead-letters/{letter}/discard/", None, (403, 200, 404, 401)),
    ("get", "/api/webhook-receipts/{receipt}/", None, (200, 200, 404, 401)),
    ("get", "/api/outbox/", None, (403, 200, 403, 401)),
    ("get", "/api/tokens/", None, (200, 200, 200, 401)),
]

# Collections: everyone signed in gets 200, but only members see workspace alpha's rows.
LISTS: list[tuple[str, str]] = [
    ("/api/tasks/", "task"),
    ("/api/runs/", "run"),
    ("/api/repositories/", "repo"),
    ("/api/dead-letters/", "letter"),
    ("/api/webhook-receipts/", "receipt"),
    ("/api/workspaces/", "ws"),
]


def _fill(value: Any, ids: dict[str, Any]) -> Any:
    if (
        isinstance(value, str)
        and value.startswith("{")
        and value.endswith("}")
        and value.count("{") == 1
    ):
        return ids[value[1:-1]]
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    "method, path, body, expected", MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX]
)
@pytest.mark.parametrize("role", ROLES)
def test_endpoint_answers_per_role(world, role, method, path, body, expected):
    url = _fill(path, world.ids)
    response = getattr(world.clients[role], method)(url, _fill(body, world.ids), format="json")

    assert response.status_code == expected[ROLES.index(role)], response.content
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["status"] == response.status_code
        # A problem and nothing else: no field of the object leaks into the error.
        assert set(response.json()) <= {
            "type",
            "title",
            "status",
            "detail",
            "code",
            "instance",
            "errors",
        }


@pytest.mark.parametrize("path, key", LISTS)
@pytest.mark.parametrize("role", ROLES)
def test_lists_show_only_the_callers_workspaces(world, role, path, key):
    response = world.clients[role].get(path)

    if role == "anon":
        assert response.status_code == 401
        return
    assert response.status_code == 200
    body = response.json()
    rows = body["results"] if isinstance(body, dict) else body
    identities = {str(row.get("id", row.get("slug"))) for row in rows}
    visible = str(world.ids[key]) in identities
    assert visible is (role in ("member", "admin"))
