"""A repository's webhook URL is shown, its secret made by a rotation and shown once (API
and console); members link their provider accounts, admins any member's, and nobody
another workspace's."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import Membership, ProviderIdentity, Repository
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory
from tests.webhooks.test_webhook_support import corpus, github_post
from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db


def _client(workspace, role: str, username: str) -> tuple[APIClient, object]:
    user = UserFactory(username=username)
    Membership.objects.create(workspace=workspace, user=user, role=role)
    api = APIClient()
    api.default_format = "json"
    api.force_authenticate(user)
    return api, user


@pytest.fixture
def workspace():
    return WorkspaceFactory(slug="first")


@pytest.fixture
def repository(workspace) -> Repository:
    return RepositoryFactory(
        workspace=workspace, provider="github", external_id="Codertocat/Hello-World"
    )


def test_the_webhook_url_is_shown_and_the_secret_is_shown_once(client, workspace, repository):
    admin, _ = _client(workspace, Membership.Role.ADMIN, "ada")
    shown = admin.get(f"/api/repositories/{repository.pk}/").json()
    assert shown["webhook_url"] == f"http://testserver/webhooks/github/{repository.pk}/"
    assert shown["has_webhook_secret"] is False

    first = admin.post(f"/api/repositories/{repository.pk}/webhook-secret/")
    second = admin.post(f"/api/repositories/{repository.pk}/webhook-secret/")

    assert (first.status_code, second.status_code) == (201, 201)
    old, new = first.json()["webhook_secret"], second.json()["webhook_secret"]
    assert len(new) >= 32 and old != new
    assert second.json()["webhook_url"] == shown["webhook_url"]
    again = admin.get(f"/api/repositories/{repository.pk}/")
    assert again.json()["has_webhook_secret"] is True
    assert new not in again.content.decode() and "webhook_secret" not in again.json()
    listed = admin.get("/api/repositories/").content.decode()
    assert new not in listed
    url = f"/webhooks/github/{repository.pk}/"
    payload = corpus("github", "issues/opened")
    assert github_post(client, payload, "issues", path=url, secret=old).status_code == 401
    assert github_post(client, payload, "issues", path=url, secret=new).status_code == 202
    assert WebhookReceipt.objects.get().repository_ids == [repository.pk]


def test_only_the_workspaces_admins_rotate_its_secrets(workspace, repository):
    member, _ = _client(workspace, Membership.Role.APPROVER, "val")
    outsider, _ = _client(WorkspaceFactory(), Membership.Role.ADMIN, "oz")

    assert member.post(f"/api/repositories/{repository.pk}/webhook-secret/").status_code == 403
    assert outsider.post(f"/api/repositories/{repository.pk}/webhook-secret/").status_code == 404
    repository.refresh_from_db()
    assert repository.webhook_secret == ""


def test_the_console_rotates_a_secret_and_shows_it_on_its_own_page(admin_client, repository):
    response = admin_client.post(
        "/admin/runs/repository/",
        {"action": "rotate_webhook_secret", "_selected_action": [repository.pk]},
    )

    assert response.status_code == 200
    repository.refresh_from_db()
    assert len(repository.webhook_secret) >= 32
    page = response.content.decode()
    assert repository.webhook_secret in page
    assert f"/webhooks/github/{repository.pk}/" in page
    assert "no-store" in response["Cache-Control"]
    change = admin_client.get(f"/admin/runs/repository/{repository.pk}/change/").content.decode()
    assert repository.webhook_secret not in change
    assert f"/webhooks/github/{repository.pk}/" in change


def test_a_member_links_their_own_account_and_an_admin_any_members(workspace):
    member, mel = _client(workspace, Membership.Role.MEMBER, "mel")
    admin, _ = _client(workspace, Membership.Role.ADMIN, "ada")
    _client(workspace, Membership.Role.APPROVER, "vera")
    url = f"/api/workspaces/{workspace.slug}/identities/"

    own = member.post(url, {"provider": "github", "external_user_id": "101", "login": "mel-gh"})
    for_other = member.post(
        url, {"provider": "github", "external_user_id": "102", "username": "vera"}
    )
    by_admin = admin.post(
        url, {"provider": "github", "external_user_id": "102", "username": "vera"}
    )
    taken = admin.post(url, {"provider": "github", "external_user_id": "101", "username": "vera"})

    assert own.status_code == 201, own.content
    assert (own.json()["username"], own.json()["host"]) == ("mel", "github.com")
    assert for_other.status_code == 403
    assert by_admin.status_code == 201
    assert (taken.status_code, taken.json()["code"]) == (409, "identity_taken")
    assert sorted(i["username"] for i in member.get(url).json()) == ["mel", "vera"]
    vera_link = by_admin.json()["id"]
    assert member.delete(f"{url}{vera_link}/").status_code == 403
    assert member.delete(f"{url}{own.json()['id']}/").status_code == 204
    assert list(ProviderIdentity.objects.values_list("user__username", flat=True)) == ["vera"]
    assert mel.provider_identities.count() == 0


def test_no_one_links_a_non_member_or_in_another_workspace(workspace):
    admin, _ = _client(workspace, Membership.Role.ADMIN, "ada")
    other = WorkspaceFactory(slug="second")
    _client(other, Membership.Role.APPROVER, "stranger")

    not_member = admin.post(
        f"/api/workspaces/{workspace.slug}/identities/",
        {"provider": "github", "external_user_id": "7", "username": "stranger"},
    )
    elsewhere = admin.post(
        f"/api/workspaces/{other.slug}/identities/", {"provider": "github", "external_user_id": "7"}
    )

    assert not_member.status_code == 422
    assert elsewhere.status_code == 404
    assert not ProviderIdentity.objects.exists()
