"""A delivery reaches only repositories that proved they own it: their own secret signed
it. Claiming another workspace's ``external_id`` gets nothing; a delivery signed with
another repository's secret is refused and changes nothing. Real signed corpus
payloads, posted through the test client to the shared URL and to each repository's."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from runs.models import Membership, Repository, Task
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory
from tests.webhooks.test_webhook_support import GITHUB_SECRET, corpus, github_post, gitlab_post
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db

FIRST_SECRET = "first-workspace-hook-secret"
SECOND_SECRET = "second-workspace-hook-secret"


@pytest.fixture
def owner() -> Repository:
    """The first workspace's repository, configured on GitHub with its own secret."""
    return RepositoryFactory(
        workspace=WorkspaceFactory(slug="first"),
        provider="github",
        external_id="octo/h2",
        webhook_secret=FIRST_SECRET,
    )


def _labelled_issue() -> dict[str, Any]:
    payload = corpus("github", "issues/labeled")
    payload["label"]["name"] = "agent"
    payload["repository"]["full_name"] = "octo/h2"
    payload["issue"]["title"] = "Secret roadmap item"
    return payload


def _process_all() -> None:
    for receipt in WebhookReceipt.objects.filter(status="received"):
        webhook_receipt_process(receipt_id=receipt.pk)


@pytest.mark.parametrize("second_secret", ["", SECOND_SECRET])
def test_a_second_workspace_claiming_the_external_id_receives_nothing(client, owner, second_secret):
    squatter = RepositoryFactory(
        workspace=WorkspaceFactory(slug="second"),
        provider="github",
        external_id="octo/h2",
        webhook_secret=second_secret,
    )

    shared = github_post(client, _labelled_issue(), "issues", secret=FIRST_SECRET)
    own = github_post(
        client,
        _labelled_issue(),
        "issues",
        secret=FIRST_SECRET,
        path=f"/webhooks/github/{owner.pk}/",
    )
    _process_all()

    assert (shared.status_code, own.status_code) == (202, 202)
    for receipt in WebhookReceipt.objects.all():
        assert receipt.repository_ids == [owner.pk]
    assert Task.objects.filter(repository=owner).count() == 1
    assert not Task.objects.filter(workspace=squatter.workspace).exists()
    assert not Task.objects.filter(instruction__contains="Secret roadmap").exclude(repository=owner)
    # Nor can the second workspace read the deliveries through the API.
    assert _receipts_seen_by(squatter) == []
    assert len(_receipts_seen_by(owner)) == 2


def _receipts_seen_by(repository: Repository) -> list[dict[str, Any]]:
    admin = UserFactory()
    Membership.objects.create(workspace=repository.workspace, user=admin, role="admin")
    api = APIClient()
    api.force_authenticate(admin)
    listed = api.get("/api/webhook-receipts/").json()["results"]
    for receipt in WebhookReceipt.objects.all():
        detail = api.get(f"/api/webhook-receipts/{receipt.pk}/")
        assert detail.status_code == (200 if listed else 404)
    return listed


def test_the_installation_secret_routes_to_no_workspace(client, settings, owner):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    RepositoryFactory(workspace=WorkspaceFactory(), provider="github", external_id="octo/h2")

    response = github_post(client, _labelled_issue(), "issues", secret=GITHUB_SECRET)
    _process_all()

    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get()
    assert (receipt.repository_ids, receipt.status) == ([], "ignored")
    assert "no repository proved it owns octo/h2" in receipt.status_reason
    assert not Task.objects.exists()


@pytest.mark.parametrize("shared_url", [False, True])
def test_a_delivery_signed_with_another_repositorys_secret_is_refused(client, owner, shared_url):
    squatter = RepositoryFactory(
        workspace=WorkspaceFactory(slug="second"),
        provider="github",
        external_id="octo/other",
        webhook_secret=SECOND_SECRET,
    )
    path = "/webhooks/github/" if shared_url else f"/webhooks/github/{owner.pk}/"

    response = github_post(client, _labelled_issue(), "issues", secret=SECOND_SECRET, path=path)

    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert (problem["status"], problem["code"]) == (401, "signature_mismatch")
    assert problem["type"].endswith(":signature_mismatch")
    assert not WebhookReceipt.objects.exists()
    assert not Task.objects.exists()
    assert squatter.tasks.count() == 0


def test_a_gitlab_delivery_with_another_repositorys_token_is_refused(client):
    owner = RepositoryFactory(
        provider="gitlab", external_id="gitlabhq/gitlab-test", webhook_secret=FIRST_SECRET
    )
    RepositoryFactory(
        provider="gitlab", external_id="gitlabhq/gitlab-test", webhook_secret=SECOND_SECRET
    )
    issue = corpus("gitlab", "issue")
    issue["changes"]["labels"] = {"previous": [], "current": [{"title": "agent"}]}

    foreign = gitlab_post(
        client, issue, token=SECOND_SECRET + "x", path=f"/webhooks/gitlab/{owner.pk}/"
    )
    other = gitlab_post(client, issue, token=SECOND_SECRET, path=f"/webhooks/gitlab/{owner.pk}/")
    mine = gitlab_post(client, issue, token=FIRST_SECRET)
    _process_all()

    assert (foreign.status_code, other.status_code, mine.status_code) == (401, 401, 202)
    assert other.json()["code"] == "signature_mismatch"
    assert WebhookReceipt.objects.get().repository_ids == [owner.pk]
    assert list(Task.objects.values_list("repository_id", flat=True)) == [owner.pk]


def test_a_repository_without_a_secret_refuses_deliveries_on_its_url(client, settings):
    """Its URL does not fall back to the installation secret: no secret, no proof."""
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    repository = RepositoryFactory(provider="github", external_id="octo/h2")

    response = github_post(
        client,
        _labelled_issue(),
        "issues",
        secret=GITHUB_SECRET,
        path=f"/webhooks/github/{repository.pk}/",
    )

    assert response.status_code == 401
    assert response.json()["code"] == "signature_no_secret"
    assert not WebhookReceipt.objects.exists()
