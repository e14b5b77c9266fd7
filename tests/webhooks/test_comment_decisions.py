"""`/agent approve` and `/agent reject` comments decide under the same policy as the API:
as the platform user the commenter's provider account is linked to, with the approver
role, never the requester of a high-risk run, only the patch that is pending; a refusal
is answered on the issue through the provider's client (a local GitHub speaking its
REST API)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import WorkItem
from jobs.work_execution import work_execute
from runs.models import (
    Approval,
    Artifact,
    Membership,
    Patch,
    ProviderIdentity,
    Repository,
    Run,
    Task,
)
from tests.chaos.fakegithub import FakeGitHub
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db

SHA = "1a2b3c4d" + "e" * 56
FULL_NAME = "octo/h2"
ISSUE = 7
_COMMENT_IDS = itertools.count()
COMMENTER_ID = corpus("github", "issue_comment/created")["comment"]["user"]["id"]


@pytest.fixture
def github(settings) -> Iterator[FakeGitHub]:
    fake = FakeGitHub()
    yield fake
    fake.close()


@pytest.fixture
def repository() -> Repository:
    return RepositoryFactory(
        workspace=WorkspaceFactory(),
        provider="github",
        external_id=FULL_NAME,
        webhook_secret=REPOSITORY_SECRET,
    )


def _awaiting(repository: Repository, *, requested_by: str = "", risk: str = "low") -> Run:
    """A run of the task made from issue #7, waiting for approval of one patch."""
    task = TaskFactory(
        workspace=repository.workspace,
        repository=repository,
        requested_by=requested_by,
        risk_level=risk,
        source=Task.Source.WEBHOOK,
        idempotency_key=f"github:issue:{FULL_NAME}#{ISSUE}",
    )
    run = Run.objects.create(task=task, run_no=1, status=Run.Status.AWAITING_APPROVAL)
    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256=SHA)
    patch = Patch.objects.create(run=run, diff_sha256=SHA, diff_artifact=diff)
    Approval.objects.create(
        run=run, patch=patch, patch_sha256=SHA, expires_at=timezone.now() + timedelta(hours=1)
    )
    return run


def _member(repository: Repository, username: str, role: str, *, linked: bool = True) -> Any:
    user = UserFactory(username=username)
    Membership.objects.create(workspace=repository.workspace, user=user, role=role)
    if linked:
        ProviderIdentity.objects.create(
            workspace=repository.workspace,
            user=user,
            provider="github",
            host="github.com",
            external_user_id=str(COMMENTER_ID),
            login="Codertocat",
        )
    return user


def _comment(client: Any, body: str, *, written_at: Any = None) -> WebhookReceipt:
    payload = corpus("github", "issue_comment/created")
    payload["repository"]["full_name"] = FULL_NAME
    payload["issue"]["number"] = ISSUE
    payload["comment"]["id"] += next(_COMMENT_IDS)
    payload["comment"]["body"] = body
    payload["comment"]["author_association"] = "OWNER"
    payload["comment"]["created_at"] = (written_at or timezone.now()).isoformat()
    response = github_post(client, payload, "issue_comment", secret=REPOSITORY_SECRET)
    assert response.status_code == 202, response.content
    receipt_id = response.json()["receipt_id"]
    webhook_receipt_process(receipt_id=receipt_id)
    return WebhookReceipt.objects.get(pk=receipt_id)


def _replies(github: FakeGitHub, settings: Any) -> list[str]:
    """Send the answers the refusals queued, to the local GitHub; their bodies."""
    settings.GITHUB_API_URL = github.url
    for item in WorkItem.objects.filter(kind="webhook.reply", status=WorkItem.Status.PENDING):
        work_execute(item_id=item.pk)
    return [c["body"] for c in github.comments.get((FULL_NAME, ISSUE), [])]


def _pending(run: Run) -> bool:
    run.refresh_from_db()
    approval = Approval.objects.get(run=run)
    return run.status == Run.Status.AWAITING_APPROVAL and approval.status == "pending"


def test_self_approval_of_a_high_risk_run_by_comment_is_refused_and_answered(
    client, repository, github, settings
):
    requester = _member(repository, "rita", Membership.Role.APPROVER)
    run = _awaiting(repository, requested_by=requester.username, risk="high")
    # The API refuses her...
    api = APIClient()
    api.force_authenticate(requester)
    refused = api.post(f"/api/runs/{run.id}/approve/", {"patch_sha256": SHA}, format="json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "self_approval_not_allowed"

    # ...and so does her comment, naming the very patch.
    receipt = _comment(client, f"/agent approve {SHA[:7]} ship it")

    assert receipt.status == "ignored"
    assert "self_approval_not_allowed" in receipt.status_reason
    assert _pending(run)
    assert not run.events.filter(type__startswith="agent.approval.").exists()
    (reply,) = _replies(github, settings)
    assert "self_approval_not_allowed" in reply and "/agent approve" in reply


def test_self_approval_is_refused_for_the_account_that_labelled_the_issue(
    client, repository, github, settings
):
    """A task made from an issue is requested by the provider account that labelled it."""
    _member(repository, "rita", Membership.Role.APPROVER)
    run = _awaiting(repository, requested_by="github:Codertocat", risk="high")

    receipt = _comment(client, f"/agent approve {SHA[:12]}")

    assert "self_approval_not_allowed" in receipt.status_reason
    assert _pending(run)


def test_an_unlinked_commenter_cannot_approve_or_reject(client, repository, github, settings):
    _member(repository, "vera", Membership.Role.APPROVER, linked=False)
    run = _awaiting(repository)

    approve = _comment(client, f"/agent approve {SHA[:7]}")
    reject = _comment(client, "/agent reject no")

    assert "identity_not_linked" in approve.status_reason
    assert "identity_not_linked" in reject.status_reason
    assert _pending(run)
    replies = _replies(github, settings)
    assert len(replies) == 2
    assert all("identity_not_linked" in reply for reply in replies)


def test_a_linked_member_without_the_approver_role_is_refused(client, repository, github, settings):
    _member(repository, "mel", Membership.Role.MEMBER)
    run = _awaiting(repository)

    receipt = _comment(client, f"/agent approve {SHA[:7]}")

    assert "approval_not_allowed" in receipt.status_reason
    assert _pending(run)
    assert "approval_not_allowed" in _replies(github, settings)[0]


def test_a_linked_approvers_comment_approves_the_named_patch(client, repository, github, settings):
    approver = _member(repository, "vera", Membership.Role.APPROVER)
    run = _awaiting(repository, requested_by="someone-else", risk="high")

    receipt = _comment(client, f"/agent approve {SHA[:7]} looks good")

    assert receipt.status == "processed", receipt.status_reason
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by, approval.comment) == (
        "approved",
        approver.username,
        "looks good",
    )
    event = run.events.get(type="agent.approval.approved")
    assert (event.actor, event.data["patch_sha256"]) == (approver.username, SHA)
    assert _replies(github, settings) == []


def test_a_comment_naming_another_patch_is_refused_as_stale(client, repository, github, settings):
    _member(repository, "vera", Membership.Role.APPROVER)
    run = _awaiting(repository)

    receipt = _comment(client, "/agent approve 0000000 the one I saw")

    assert "approval_stale" in receipt.status_reason
    assert _pending(run)
    assert "approval_stale" in _replies(github, settings)[0]


def test_a_comment_written_before_the_patch_was_put_up_is_refused_as_stale(
    client, repository, github, settings
):
    _member(repository, "vera", Membership.Role.APPROVER)
    run = _awaiting(repository)

    receipt = _comment(client, "/agent approve", written_at=timezone.now() - timedelta(hours=1))

    assert "approval_stale" in receipt.status_reason
    assert _pending(run)


def test_a_linked_approver_who_left_the_workspace_no_longer_decides(
    client, repository, github, settings
):
    approver = _member(repository, "vera", Membership.Role.APPROVER)
    Membership.objects.filter(user=approver).delete()
    run = _awaiting(repository)

    receipt = _comment(client, f"/agent approve {SHA[:7]}")

    assert "identity_not_linked" in receipt.status_reason
    assert _pending(run)
