"""A repository registered through the API without a test command gets the detected
defaults, as repository_add's does: blank test and setup commands (detected at each run)
and a setup allowed the network to install the test dependencies."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import Membership, Repository
from tests.factories import UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> APIClient:
    """A workspace admin's API client."""
    workspace = WorkspaceFactory(slug="ours")
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="admin")
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_an_api_registration_without_a_test_command_detects_it_at_each_run(client):
    answer = client.post(
        "/api/repositories/",
        {"workspace": "ours", "name": "r", "clone_url": "https://github.com/octo/r.git"},
        format="json",
    )

    assert answer.status_code == 201, answer.content
    assert answer.json()["test_command"] == ""
    repository = Repository.objects.get(name="r")
    assert (repository.test_command, repository.setup_command) == ("", "")
    assert repository.setup_network is True


def test_an_explicit_test_command_is_kept(client):
    answer = client.post(
        "/api/repositories/",
        {
            "workspace": "ours",
            "name": "r",
            "clone_url": "https://github.com/octo/r.git",
            "test_command": "make test",
        },
        format="json",
    )

    assert answer.status_code == 201, answer.content
    assert Repository.objects.get(name="r").test_command == "make test"
