"""Console actions call the services, say how many rows changed, and are audited."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from jobs.models import DeadLetter, OutboxEvent
from runs.models import Approval, Membership, Run, RunEvent
from tests.factories import (
    DeadLetterFactory,
    OutboxEventFactory,
    RunFactory,
    UserFactory,
    WebhookReceiptFactory,
)
from tests.runs.test_admin_run_page import run_history_create


@pytest.fixture
def operator(db: Any) -> Any:
    from django.contrib.auth.models import Group

    user = UserFactory(username="oncall", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    return user


@pytest.fixture
def op_client(client: Any, operator: Any) -> Any:
    client.force_login(operator)
    return client


def _act(client: Any, name: str, action: str, pks: list[Any], **extra: str) -> Any:
    return client.post(
        reverse(f"admin:{name}_changelist"),
        {"action": action, ACTION_CHECKBOX_NAME: [str(pk) for pk in pks], "index": 0, **extra},
        follow=True,
    )


def _operate(client: Any, run: Any, action: str) -> Any:
    """The run page's button, sending the hash of the diff the page showed."""
    approval = Approval.objects.filter(run=run).order_by("-requested_at").first()
    return client.post(
        f"/admin/runs/run/{run.pk}/operate/{action}/",
        {"patch_sha256": approval.patch_sha256 if approval else ""},
        follow=True,
    )


def _messages(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def _audited(obj: Any, user: Any) -> list[str]:
    return [e.change_message for e in LogEntry.objects.filter(object_id=str(obj.pk), user=user)]


def test_cancel_records_the_request_and_an_operator_event(
    op_client: Any,
    operator: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = run_history_create()
    done = RunFactory(status=Run.Status.COMPLETED)

    response = _act(op_client, "runs_run", "cancel_runs", [run.pk, done.pk])

    run.refresh_from_db()
    assert run.cancel_requested_by == "oncall"
    assert "Cancel: 1 row(s) changed." in _messages(response)
    assert any("1 row(s) left unchanged" in m for m in _messages(response))
    action = RunEvent.objects.get(run=run, type="agent.run.operator_action")
    assert action.actor == "oncall"
    assert action.data["action"] == "cancel" and action.data["outcome"] == "done"
    assert (
        RunEvent.objects.get(run=done, type="agent.run.operator_action").data["outcome"]
        == "refused"
    )
    assert _audited(run, operator) == ["Cancel: done"]


def test_approve_and_reject_decide_the_pending_approval(op_client: Any, operator: Any) -> None:
    approved, rejected = run_history_create(), run_history_create()
    for run in (approved, rejected):
        Membership.objects.create(
            workspace=run.task.workspace, user=operator, role=Membership.Role.APPROVER
        )

    first = _operate(op_client, approved, "approve")
    second = _operate(op_client, rejected, "reject")

    assert "Approve: 1 row(s) changed." in _messages(first)
    assert "Reject: 1 row(s) changed." in _messages(second)
    assert Approval.objects.get(run=approved).status == Approval.Status.APPROVED
    assert Approval.objects.get(run=approved).decided_by == "oncall"
    assert Approval.objects.get(run=rejected).status == Approval.Status.REJECTED


def test_approving_a_run_not_awaiting_approval_is_refused_and_audited(
    op_client: Any,
    operator: Any,
) -> None:
    run = RunFactory(status=Run.Status.RUNNING)

    response = _operate(op_client, run, "approve")

    assert any("not awaiting approval" in m for m in _messages(response))
    assert _audited(run, operator) == ["Approve: skipped (run is running, not awaiting approval)"]


def test_retry_starts_a_new_run_of_a_finished_task(op_client: Any) -> None:
    run = RunFactory(status=Run.Status.FAILED, run_no=1)

    response = _act(op_client, "runs_run", "retry_runs", [run.pk])

    assert "Retry: 1 row(s) changed." in _messages(response)
    new = Run.objects.get(task=run.task, run_no=2)
    assert new.status == Run.Status.QUEUED
    audit = RunEvent.objects.get(run=run, type="agent.run.operator_action", actor="oncall")
    assert audit.data["note"] == "started run 2"
    assert RunEvent.objects.filter(run=new, type="agent.run.queued", actor="oncall").exists()


def test_run_page_button_cancels_and_returns_to_the_run(op_client: Any) -> None:
    run = run_history_create()

    response = op_client.post(
        reverse("admin:runs_run_operate", args=[run.pk, "cancel"]), {"comment": "wrong repository"}
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("admin:runs_run_change", args=[run.pk])
    run.refresh_from_db()
    assert run.cancel_reason == "wrong repository"


def test_dead_letter_requeue_and_discard(op_client: Any, operator: Any) -> None:
    requeue, discard = DeadLetterFactory(), DeadLetterFactory()

    first = _act(op_client, "jobs_deadletter", "requeue", [requeue.pk])
    second = _act(op_client, "jobs_deadletter", "discard", [discard.pk])
    again = _act(op_client, "jobs_deadletter", "discard", [discard.pk])

    requeue.refresh_from_db()
    discard.refresh_from_db()
    assert (requeue.status, requeue.resolved_by) == (DeadLetter.Status.REQUEUED, "oncall")
    assert discard.status == DeadLetter.Status.DISCARDED
    assert "Requeue: 1 row(s) changed." in _messages(first)
    assert "Discard: 1 row(s) changed." in _messages(second)
    assert any("1 row(s) left unchanged" in m for m in _messages(again))
    assert _audited(requeue, operator) == ["Requeue: done"]


def test_outbox_republish_marks_events_pending_again(
    op_client: Any,
    operator: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django.utils import timezone

    event = OutboxEventFactory(published_at=timezone.now(), attempts=1)

    with django_capture_on_commit_callbacks() as callbacks:
        response = _act(op_client, "jobs_outboxevent", "republish", [event.pk])

    event.refresh_from_db()
    assert event.published_at is None
    assert "Republish: 1 event(s) queued for the relay." in _messages(response)
    assert callbacks, "the relay is woken on commit"
    assert _audited(event, operator) == ["republish requested"]
    assert OutboxEvent.objects.filter(published_at__isnull=True).count() == 1


def test_webhook_reprocess_sends_the_receipt_to_processing_again(
    op_client: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    receipt = WebhookReceiptFactory(status="failed", attempts=1)

    with django_capture_on_commit_callbacks():
        response = _act(op_client, "webhooks_webhookreceipt", "reprocess", [receipt.pk])

    receipt.refresh_from_db()
    assert receipt.status == "received"
    assert "oncall" in receipt.status_reason
    assert "Reprocess: 1 row(s) changed." in _messages(response)
