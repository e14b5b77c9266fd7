"""Against a real worker: the requester of a high-risk run, linked to the commenter,
approves by comment; the worker refuses it, the run keeps waiting, and the refusal is
posted on the issue (a local GitHub) by the worker's reply work item."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runs import demo
from runs.models import Approval, Membership, ProviderIdentity, Run, Task
from runs.services import task_submit
from tests.chaos.fakegithub import FakeGitHub
from tests.conftest import wait_for
from tests.factories import UserFactory
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_self_approval_by_comment_is_refused_by_the_worker_and_answered(
    client, repository, start_worker
):
    github = FakeGitHub()
    try:
        repository.external_id = "octo/e2e"
        repository.webhook_secret = REPOSITORY_SECRET
        repository.save(update_fields=["external_id", "webhook_secret"])
        rita = UserFactory(username="rita")
        Membership.objects.create(workspace=repository.workspace, user=rita, role="approver")
        payload = corpus("github", "issue_comment/created")
        ProviderIdentity.objects.create(
            workspace=repository.workspace,
            user=rita,
            provider="github",
            host="127.0.0.1",  # the worker's GITHUB_API_URL is the local GitHub
            external_user_id=str(payload["comment"]["user"]["id"]),
            login="Codertocat",
        )
        start_worker(env={"GITHUB_API_URL": github.url, "GITHUB_TOKEN": "ghp_" + "r" * 36})
        submission = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction="Fix add()",
            requested_by="rita",
            risk_level=Task.Risk.HIGH,
            execution_mode=Task.Mode.SUPERVISED_PR,
            model_options={"provider": "scripted", "script": demo.fix_script()},
            source_ref={"provider": "github", "repo": "octo/e2e", "issue_number": 3},
            source=Task.Source.WEBHOOK,
            idempotency_key="github:issue:octo/e2e#3",
        )
        run = submission.run
        wait_for(
            lambda: Run.objects.filter(pk=run.pk, status="awaiting_approval").exists(),
            timeout=60,
            message="awaiting approval",
        )
        sha = Approval.objects.get(run=run, status="pending").patch_sha256

        payload["repository"]["full_name"] = "octo/e2e"
        payload["issue"]["number"] = 3
        payload["comment"]["body"] = f"/agent approve {sha[:7]}"
        payload["comment"]["author_association"] = "OWNER"
        payload["comment"]["created_at"] = timezone.now().isoformat()
        assert (
            github_post(client, payload, "issue_comment", secret=REPOSITORY_SECRET).status_code
            == 202
        )

        replies = wait_for(
            lambda: github.comments.get(("octo/e2e", 3)),
            timeout=60,
            message="the refusal posted on the issue",
        )
        assert "self_approval_not_allowed" in replies[0]["body"]
        receipt = WebhookReceipt.objects.get()
        assert (receipt.status, receipt.repository_ids) == ("ignored", [repository.pk])
        assert Run.objects.get(pk=run.pk).status == Run.Status.AWAITING_APPROVAL
        assert Approval.objects.get(run=run).status == "pending"
        assert not github.pulls
    finally:
        github.close()
