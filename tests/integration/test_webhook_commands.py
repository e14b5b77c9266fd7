"""Each webhook command end to end: a delivery over HTTP, a real worker, the orchestrator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from runs import demo
from runs.models import Approval, Membership, ProviderIdentity, PullRequest, Run, Task
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.factories import UserFactory
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, followup_script
from tests.webhooks.test_webhook_support import github_post as post_signed
from webhooks.models import CiResult, WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def webhook_settings(settings, monkeypatch):
    # Read by the worker process, which submits the tasks.
    monkeypatch.setenv(
        "WEBHOOK_TASK_MODEL_OPTIONS",
        json.dumps({"provider": "scripted", "script": followup_script()}),
    )


@pytest.fixture
def mapped(repository):
    """The repository the deliveries are for; they prove it with its own secret."""
    repository.external_id = "octo/e2e"
    repository.webhook_secret = REPOSITORY_SECRET
    repository.save(update_fields=["external_id", "webhook_secret"])
    return repository


def github_post(client, payload, event, **kwargs):
    return post_signed(client, payload, event, secret=REPOSITORY_SECRET, **kwargs)


def _run(task: Task, run_no: int, timeout: float = 60) -> Run:
    def ended() -> Run | None:
        run = task.runs.filter(run_no=run_no).first()
        return run if run is not None and run.status in TERMINAL else None

    return wait_for(ended, timeout=timeout, message=f"run {run_no} to end")


def _status(run: Run, status: str) -> Run | None:
    run.refresh_from_db()
    return run if run.status == status else None


def _with_repo(payload: dict[str, Any], full_name: str = "octo/e2e") -> dict[str, Any]:
    payload["repository"]["full_name"] = full_name
    return payload


def _comment(
    number: int, body: str, *, on_pr: bool = False, association: str = "OWNER"
) -> dict[str, Any]:
    payload = _with_repo(corpus("github", "issue_comment/created"))
    payload["issue"]["number"] = number
    if on_pr:
        payload["issue"]["pull_request"] = {"url": "https://example.invalid/pulls"}
    payload["comment"]["body"] = body
    payload["comment"]["author_association"] = association
    # Written now: a decision that names no patch is about the one pending when written.
    payload["comment"]["created_at"] = timezone.now().isoformat()
    return payload


def test_issue_review_ci_and_merge_drive_the_task(client, mapped, start_worker):
    start_worker()
    issue = _with_repo(corpus("github", "issues/labeled"))
    issue["label"]["name"] = "agent"
    assert github_post(client, issue, "issues").status_code == 202

    task = wait_for(
        lambda: Task.objects.filter(idempotency_key="github:issue:octo/e2e#1").first(),
        message="task from the issue",
    )
    assert task.source == "webhook"
    assert task.source_ref["issue_number"] == 1
    first = _run(task, 1)
    assert first.status == Run.Status.COMPLETED, (first.failure_reason, first.failure_detail)
    pr = PullRequest.objects.get(task=task)

    # Review requesting changes on the agent PR: a follow-up run with the review.
    review = _with_repo(corpus("github", "pull_request_review/submitted"))
    review["review"]["state"] = "changes_requested"
    review["review"]["body"] = "Please keep a note of what changed."
    review["pull_request"]["head"]["ref"] = pr.branch
    review["pull_request"]["number"] = pr.number
    assert github_post(client, review, "pull_request_review").status_code == 202
    second = _run(task, 2)
    assert "Please keep a note" in second.feedback
    assert second.status == Run.Status.COMPLETED, (second.failure_reason, second.failure_detail)

    # CI fails on the PR's head commit: recorded, and one follow-up with the summary.
    pr.refresh_from_db()
    check = _with_repo(corpus("github", "check_run/completed.1"))
    check["check_run"]["head_sha"] = pr.head_sha
    check["check_run"]["check_suite"]["head_branch"] = pr.branch
    check["check_run"]["pull_requests"] = []
    check["check_run"]["output"]["title"] = "2 lint errors"
    assert github_post(client, check, "check_run").status_code == 202
    third = _run(task, 3)
    assert "2 lint errors" in third.feedback
    result = CiResult.objects.get(pull_request=pr)
    assert (result.conclusion, result.followup_requested) == ("failure", True)

    # The PR is merged: PR and task say so.
    closed = _with_repo(corpus("github", "pull_request/closed"))
    closed["pull_request"]["merged"] = True
    closed["pull_request"]["head"]["ref"] = pr.branch
    closed["pull_request"]["number"] = pr.number
    assert github_post(client, closed, "pull_request").status_code == 202
    wait_for(
        lambda: PullRequest.objects.filter(pk=pr.pk, state="merged").exists(), message="PR merged"
    )
    wait_for(
        lambda: Task.objects.filter(pk=task.pk, status="completed").exists(),
        message="task completed",
    )
    assert task.runs.count() == 3
    assert WebhookReceipt.objects.filter(status="failed").count() == 0


@pytest.mark.parametrize(
    ("command", "final"),
    [
        ("/agent approve {sha} looks good", Run.Status.COMPLETED),
        ("/agent reject not like this", Run.Status.FAILED),
        ("/agent cancel", Run.Status.CANCELLED),
    ],
)
def test_approval_and_cancel_commands_from_issue_comments(
    client, mapped, start_worker, command, final
):
    # The corpus' commenter is linked to an approver of the workspace.
    approver = UserFactory(username="vera")
    Membership.objects.create(workspace=mapped.workspace, user=approver, role="approver")
    ProviderIdentity.objects.create(
        workspace=mapped.workspace,
        user=approver,
        provider="github",
        host="github.com",
        external_user_id=str(corpus("github", "issue_comment/created")["comment"]["user"]["id"]),
        login="Codertocat",
    )
    start_worker()
    submission = task_submit(
        workspace=mapped.workspace,
        repository=mapped,
        instruction="Fix add()",
        source=Task.Source.WEBHOOK,
        execution_mode=Task.Mode.SUPERVISED_PR,
        idempotency_key="github:issue:octo/e2e#3",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    wait_for(
        lambda: _status(submission.run, Run.Status.AWAITING_APPROVAL),
        timeout=60,
        message="awaiting approval",
    )
    sha = Approval.objects.get(run=submission.run, status="pending").patch_sha256[:7]

    comment = _comment(3, command.format(sha=sha))
    assert github_post(client, comment, "issue_comment").status_code == 202

    run = wait_for(lambda: _status(submission.run, final), timeout=60, message=final)
    assert run.status == final


def test_agent_comment_on_an_issue_submits_a_task_and_on_its_pr_a_followup(
    client, mapped, start_worker
):
    start_worker()
    assert (
        github_post(
            client, _comment(9, "/agent fix add() in calc/core.py"), "issue_comment"
        ).status_code
        == 202
    )
    task = wait_for(
        lambda: Task.objects.filter(repository=mapped).first(), message="task from the comment"
    )
    assert task.instruction.startswith("fix add() in calc/core.py")
    assert _run(task, 1).status == Run.Status.COMPLETED
    pr = PullRequest.objects.get(task=task)

    followup = _comment(pr.number, "/agent also keep a note", on_pr=True)
    followup["comment"]["id"] += 1
    assert github_post(client, followup, "issue_comment").status_code == 202
    second = _run(task, 2)
    assert second.feedback == "also keep a note"


@pytest.mark.django_db
def test_command_from_a_user_without_write_access_is_ignored_with_a_reason(client, mapped):
    receipt_id = github_post(
        client, _comment(4, "/agent delete everything", association="CONTRIBUTOR"), "issue_comment"
    ).json()["receipt_id"]
    assert webhook_receipt_process(receipt_id=receipt_id) == "ignored"
    receipt = WebhookReceipt.objects.get(pk=receipt_id)
    assert "no write access" in receipt.status_reason
    assert not Task.objects.exists()
