"""The task detail says a task's effective (aged) priority and its place in the
workspace's re-admission queue; the console shows each workspace's share, its queue by
priority and its oldest wait."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from runs.models import Membership, Task
from runs.services import task_submit
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _setup() -> tuple[APIClient, Any]:
    workspace = WorkspaceFactory(max_active_runs=1, weight=3)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=10)
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    api = APIClient()
    api.force_authenticate(user)
    return api, repository


def _submit(api: APIClient, repository: Any, priority: Any) -> dict[str, Any]:
    body = {"repository": repository.pk, "instruction": "x", "priority": priority}
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def test_detail_has_effective_priority_and_queue_position() -> None:
    api, repository = _setup()
    _submit(api, repository, "normal")  # admitted: the workspace is then full
    batch = _submit(api, repository, "batch")
    security = _submit(api, repository, 10)
    maintenance = _submit(api, repository, "maintenance")
    wrong = {"repository": repository.pk, "instruction": "x", "priority": "soon"}
    assert api.post("/api/tasks/", wrong, format="json").status_code == 400
    Task.objects.filter(pk=maintenance["task_id"]).update(
        created_at=timezone.now() - timedelta(hours=100)
    )

    def detail(task: dict[str, Any]) -> dict[str, Any]:
        return api.get(f"/api/tasks/{task['task_id']}/").json()

    assert detail(security)["effective_priority"] == 10
    assert detail(maintenance)["effective_priority"] == 500 - 200
    assert [detail(t)["queue_position"] for t in (security, batch, maintenance)] == [1, 2, 3]
    admitted = Task.objects.get(workspace=repository.workspace, status="running")
    assert api.get(f"/api/tasks/{admitted.pk}/").json()["queue_position"] is None


def test_console_shows_share_queue_by_priority_and_oldest_wait(client: Any) -> None:
    _, repository = _setup()
    other = RepositoryFactory(max_active_runs=10, workspace__max_active_runs=10)
    for _ in range(2):
        task_submit(workspace=other.workspace, repository=other, instruction="o")
    for priority in ("normal", "security", "batch", "batch"):
        task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction="w",
            priority=priority,
        )
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    html = client.get(reverse("ops-dashboard")).content.decode()
    assert 'id="fair-shares"' in html
    row = html.split(repository.workspace.slug, 1)[1].split("</tr>", 1)[0]
    # weight 3 of 4 among the workspaces with runs: 3 active in all, so a share of 2.2
    assert "1 / 2.2" in row
    assert "security: 1, batch: 2" in row
    assert row.count("s</td>") == 1  # the oldest wait, in seconds
