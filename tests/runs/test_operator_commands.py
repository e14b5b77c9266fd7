"""The operator's commands: each names a run as the console shows it, goes through the
same service as the console and the API, and prints what it changed."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import Approval, Membership, Run
from tests.factories import UserFactory, WorkspaceFactory
from tests.runs.test_approval_policy import SHA, _awaiting

pytestmark = pytest.mark.django_db


def _call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_cancel_by_short_id_requests_cancellation_and_says_so(run):
    printed = _call("run_cancel", run.short_id, "--reason", "paged at 3am")

    run.refresh_from_db()
    assert run.cancel_requested_at is not None
    assert run.cancel_reason == "paged at 3am"
    assert f"run {run.short_id} #1: cancellation requested" in printed


def test_cancel_of_an_ended_run_changes_nothing_and_says_so(run):
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)

    printed = _call("run_cancel", f"{run.short_id} #1")

    run.refresh_from_db()
    assert run.cancel_requested_at is None
    assert "unchanged, it already ended completed" in printed


def test_an_unknown_or_malformed_id_is_a_clear_error(run):
    with pytest.raises(CommandError, match="no run has an id"):
        _call("run_cancel", "ffffeeee")
    with pytest.raises(CommandError, match="is not a run id"):
        _call("run_cancel", "zz")


def test_approve_applies_the_workspace_policy_to_the_named_user():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace, requested_by="rita", risk="high")
    rita = UserFactory(username="rita")
    Membership.objects.create(workspace=workspace, user=rita, role=Membership.Role.APPROVER)
    vera = UserFactory(username="vera")
    Membership.objects.create(workspace=workspace, user=vera, role=Membership.Role.APPROVER)

    with pytest.raises(CommandError, match="self_approval_not_allowed"):
        _call("run_approve", run.short_id, "--as", "rita")
    assert Approval.objects.get(run=run).status == Approval.Status.PENDING

    with pytest.raises(CommandError, match="refused"):
        _call("run_approve", run.short_id, "--as", "vera", "--patch", "b" * 64)
    assert Approval.objects.get(run=run).status == Approval.Status.PENDING

    printed = _call("run_approve", run.short_id, "--as", "vera", "--patch", SHA)
    assert Approval.objects.get(run=run).status == Approval.Status.APPROVED
    assert f"patch {SHA[:12]} approved by vera" in printed


def test_reject_needs_a_platform_user_and_records_the_decision():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace)
    with pytest.raises(CommandError, match="no user named"):
        _call("run_reject", str(run.id), "--as", "nobody")
    vera = UserFactory(username="vera")
    Membership.objects.create(workspace=workspace, user=vera, role=Membership.Role.APPROVER)

    printed = _call("run_reject", str(run.id), "--as", "vera", "--comment", "wrong module")

    assert Approval.objects.get(run=run).status == Approval.Status.REJECTED
    assert "rejected by vera" in printed


def test_retry_starts_a_new_run_of_the_task_and_is_refused_while_one_is_active(run):
    with pytest.raises(CommandError, match="run_active"):
        _call("run_retry", run.short_id)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)

    printed = _call("run_retry", run.short_id)

    new = Run.objects.filter(task=run.task).exclude(pk=run.pk).get()
    assert f"task retried as {new}" in printed
