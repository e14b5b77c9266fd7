"""A submission's repository is looked up among the caller's workspaces and is
what the queryset returned: every field as the ORM reads it, its
workspace loaded, and the same 400 bodies for another workspace's id or a wrong type."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from agentplatform.api.selectors import repository_of_member
from runs.models import Membership, Repository
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def member():
    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    repository = RepositoryFactory(
        workspace=workspace, forbidden_paths=[".github/", "secrets/"], setup_cache_paths=[]
    )
    return user, repository


def test_the_repository_is_read_as_the_orm_reads_it_with_its_workspace(member) -> None:
    user, repository = member
    found = repository_of_member(user=user, repository_id=repository.pk)
    assert found is not None
    assert found.workspace.slug == repository.workspace.slug
    expected = Repository.objects.select_related("workspace").get(pk=repository.pk)
    for field in Repository._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
    assert found.forbidden_paths == [".github/", "secrets/"]
    assert found._state.adding is False and found._state.db == "default"


def test_another_workspaces_repository_or_a_missing_one_is_not_found(member) -> None:
    user, _ = member
    theirs = RepositoryFactory()
    assert repository_of_member(user=user, repository_id=theirs.pk) is None
    assert repository_of_member(user=user, repository_id=2**31) is None
    assert repository_of_member(user=UserFactory(), repository_id=theirs.pk) is None


def _post(user, body) -> dict:
    api = APIClient()
    api.force_authenticate(user)
    response = api.post("/api/tasks/", data=json.dumps(body), content_type="application/json")
    return {"status": response.status_code, **response.json()}


def test_the_error_bodies_are_those_of_a_primary_key_field(member) -> None:
    user, _ = member
    theirs = RepositoryFactory()
    for repository_id in (theirs.pk, 2**31, 2**63 + 5):
        body = _post(user, {"repository": repository_id, "instruction": "x"})
        assert (body["status"], body["code"], body["errors"]) == (
            422,
            "unresolved_reference",
            {"repository": [f'Invalid pk "{repository_id}" - object does not exist.']},
        )
    for repository_id, message in (("1", "must be an integer"), (True, "must be an integer")):
        body = _post(user, {"repository": repository_id, "instruction": "x"})
        assert (body["status"], body["errors"]) == (400, {"repository": [message]})
    body = _post(user, {"repository": None, "instruction": "x"})
    assert (body["status"], body["errors"]) == (
        400,
        {"repository": ["This field may not be null."]},
    )
