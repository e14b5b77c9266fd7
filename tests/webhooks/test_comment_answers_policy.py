"""`/agent answer` and `/agent plan` comments answer under the approval rules: as the
linked platform user, with a role the workspace's `approval_by` allows; a refusal is
answered on the issue. A plan is accepted, edited or rejected by comment."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import WorkItem
from jobs.work_execution import work_execute
from runs.models import InputRequest, Membership, ProviderIdentity, Repository, Run, Task
from tests.chaos.fakegithub import FakeGitHub
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db

FULL_NAME = "octo/h3"
ISSUE = 9
_COMMENT_IDS = itertools.count()
COMMENTER_ID = corpus("github", "issue_comment/created")["comment"]["user"]["id"]


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
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


def _asking(repository: Repository, kind: str = "question") -> tuple[Run, InputRequest]:
    task = TaskFactory(
        workspace=repository.workspace,
        repository=repository,
        source=Task.Source.WEBHOOK,
        idempotency_key=f"github:issue:{FULL_NAME}#{ISSUE}",
        source_ref={"provider": "github", "repo": FULL_NAME, "issue_number": ISSUE},
    )
    run = Run.objects.create(task=task, run_no=1, status=Run.Status.AWAITING_INPUT, step_no=5)
    now = timezone.now()
    request = InputRequest.objects.create(
        run=run,
        key="plan" if kind == "plan" else "4:1:call_ask",
        kind=kind,
        question="1. Do it." if kind == "plan" else "Which module?",
        call_id="" if kind == "plan" else "call_ask",
        requested_at=now,
        expires_at=now + timedelta(days=1),
    )
    return run, request


def _member(repository: Repository, role: str, *, linked: bool = True) -> Any:
    user = UserFactory(username="rita")
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


def _comment(client: Any, body: str) -> WebhookReceipt:
    payload = corpus("github", "issue_comment/created")
    payload["repository"]["full_name"] = FULL_NAME
    payload["issue"]["number"] = ISSUE
    payload["comment"]["id"] += 1000 + next(_COMMENT_IDS)
    payload["comment"]["body"] = body
    payload["comment"]["author_association"] = "OWNER"
    response = github_post(client, payload, "issue_comment", secret=REPOSITORY_SECRET)
    assert response.status_code == 202, response.content
    receipt_id = response.json()["receipt_id"]
    webhook_receipt_process(receipt_id=receipt_id)
    return WebhookReceipt.objects.get(pk=receipt_id)


def _replies(github: FakeGitHub, settings: Any) -> list[str]:
    settings.GITHUB_API_URL = github.url
    for item in WorkItem.objects.filter(status=WorkItem.Status.PENDING):
        if item.kind in ("webhook.reply", "run.input.notify"):
            work_execute(item_id=item.pk)
    return [c["body"] for c in github.comments.get((FULL_NAME, ISSUE), [])]


def test_an_unlinked_commenter_cannot_answer_and_is_told_so(client, repository, github, settings):
    _member(repository, Membership.Role.APPROVER, linked=False)
    _run, request = _asking(repository)
    receipt = _comment(client, "/agent answer calc/core.py")
    assert receipt.status == "ignored" and "identity_not_linked" in receipt.status_reason
    request.refresh_from_db()
    assert request.status == "pending"
    (reply,) = _replies(github, settings)
    assert "identity_not_linked" in reply and "/agent answer" in reply


def test_a_member_the_workspace_does_not_let_decide_cannot_answer(
    client, repository, github, settings
):
    _member(repository, Membership.Role.MEMBER)
    run, request = _asking(repository)
    receipt = _comment(client, "/agent answer calc/core.py")
    assert "answer_not_allowed" in receipt.status_reason
    assert InputRequest.objects.get(pk=request.pk).status == "pending"
    assert not run.events.filter(type="agent.run.input.received").exists()


def test_a_plan_is_edited_by_comment(client, repository, github, settings):
    _member(repository, Membership.Role.APPROVER)
    _run, request = _asking(repository, kind="plan")
    receipt = _comment(client, "/agent plan edit 1. Only calc/core.py.\n2. Finish.")
    assert receipt.status == "processed", receipt.status_reason
    request.refresh_from_db()
    assert (request.decision, request.answer, request.answered_by) == (
        "edit",
        "1. Only calc/core.py.\n2. Finish.",
        "rita",
    )
    # An answer without a decision is refused for a plan.
    refused = _comment(client, "/agent answer fine")
    assert "input_already_answered" in refused.status_reason


def test_a_plan_needs_a_decision_word(client, repository, github, settings):
    _member(repository, Membership.Role.APPROVER)
    _run, request = _asking(repository, kind="plan")
    receipt = _comment(client, "/agent answer looks fine")
    assert "invalid_answer" in receipt.status_reason
    assert _comment(client, "/agent plan reject wrong module").status == "processed"
    request.refresh_from_db()
    assert (request.decision, request.answer) == ("reject", "wrong module")
