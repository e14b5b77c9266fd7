"""A list's limit and offset: a malformed value, or one given more than once, is a 400
naming the parameter, never silently replaced by the default."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import Membership
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api() -> APIClient:
    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="admin")
    repository = RepositoryFactory(workspace=workspace)
    for _ in range(3):
        TaskFactory(workspace=workspace, repository=repository)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize("path", ["/api/tasks/", "/api/runs/"])
@pytest.mark.parametrize(
    ("query", "name", "message"),
    [
        ("offset=1&offset=", "offset", "given more than once"),
        ("offset=x", "offset", "must be an integer"),
        ("offset=-1", "offset", "out of range"),
        ("limit=2&limit=", "limit", "given more than once"),
        ("limit=0", "limit", "must be at least 1"),
        ("limit=%F0%9A%89%96", "limit", "must be an integer"),
    ],
)
def test_a_malformed_or_repeated_paging_parameter_is_refused(
    api: APIClient, path: str, query: str, name: str, message: str
) -> None:
    response = api.get(f"{path}?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {name: [message]}


def test_well_formed_paging_pages(api: APIClient) -> None:
    response = api.get("/api/tasks/?limit=2&offset=1")
    assert response.status_code == 200
    body = response.json()
    assert (body["count"], len(body["results"])) == (3, 2)
