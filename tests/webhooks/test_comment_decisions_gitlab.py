"""GitLab notes decide under the same policy: a note by an unlinked account is refused and
answered on the merge request (a local GitLab speaking its notes API); once the account
is linked to an approver, its note approves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import WorkItem
from jobs.work_execution import work_execute
from runs.models import (
    Approval,
    Artifact,
    Membership,
    Patch,
    ProviderIdentity,
    PullRequest,
    Repository,
    Run,
)
from tests.factories import RepositoryFactory, TaskFactory, UserFactory
from tests.runs.gitproviders.test_gitlab_provider_merge_requests import FakeGitLab
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, gitlab_post
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db

SHA = "9f8e7d6c" + "0" * 56
PROJECT = "gitlab-org/gitlab-test"


@pytest.fixture
def gitlab(settings) -> Iterator[FakeGitLab]:
    fake = FakeGitLab()
    fake.thread.start()
    settings.GITLAB_COMMAND_USERS = ["root"]
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


@pytest.fixture
def awaiting() -> Run:
    repository: Repository = RepositoryFactory(
        provider="gitlab", external_id=PROJECT, webhook_secret=REPOSITORY_SECRET
    )
    task = TaskFactory(workspace=repository.workspace, repository=repository, risk_level="high")
    run = Run.objects.create(task=task, run_no=1, status=Run.Status.AWAITING_APPROVAL)
    PullRequest.objects.create(
        task=task, provider="gitlab", branch="master", base_branch="main", number=1
    )
    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256=SHA)
    patch = Patch.objects.create(run=run, diff_sha256=SHA, diff_artifact=diff)
    Approval.objects.create(
        run=run, patch=patch, patch_sha256=SHA, expires_at=timezone.now() + timedelta(hours=1)
    )
    return run


def _note(client, text: str, note_id: int) -> WebhookReceipt:
    payload = corpus("gitlab", "note_merge_request")
    payload["object_attributes"]["note"] = text
    payload["object_attributes"]["id"] = note_id
    response = gitlab_post(client, payload, token=REPOSITORY_SECRET)
    assert response.status_code == 202, response.content
    webhook_receipt_process(receipt_id=response.json()["receipt_id"])
    return WebhookReceipt.objects.get(pk=response.json()["receipt_id"])


def test_an_unlinked_note_is_refused_and_answered_then_a_linked_approver_approves(
    client, gitlab, awaiting, settings
):
    refused = _note(client, f"/agent approve {SHA[:8]}", 1)

    assert "identity_not_linked" in refused.status_reason
    assert Approval.objects.get(run=awaiting).status == "pending"
    settings.GITLAB_API_URL = gitlab.url
    (item,) = WorkItem.objects.filter(kind="webhook.reply")
    assert work_execute(item_id=item.pk) == "done"
    (reply,) = gitlab.notes[(PROJECT, "merge_requests", 1)]
    assert "identity_not_linked" in reply["body"]

    approver = UserFactory(username="gina")
    Membership.objects.create(workspace=awaiting.workspace, user=approver, role="approver")
    ProviderIdentity.objects.create(
        workspace=awaiting.workspace,
        user=approver,
        provider="gitlab",
        host="127.0.0.1",  # the host of GITLAB_API_URL, the local GitLab
        external_user_id=str(corpus("gitlab", "note_merge_request")["user"]["id"]),
        login="root",
    )
    approved = _note(client, f"/agent approve {SHA[:8]}", 2)

    assert approved.status == "processed", approved.status_reason
    approval = Approval.objects.get(run=awaiting)
    assert (approval.status, approval.decided_by) == ("approved", "gina")
