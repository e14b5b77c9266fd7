"""Who may approve is the workspace's setting: approvers (or any member, if it says so),
never the requester of a high-risk task unless allowed, only the diff that was shown,
never in bulk, and every decision on the timeline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.utils import timezone
from rest_framework.test import APIClient

from runs.models import Approval, Artifact, Membership, Patch, Run, Task, Workspace
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db

SHA = "a" * 64


def _awaiting(*, workspace: Workspace, requested_by: str = "", risk: str = "low") -> Run:
    task = TaskFactory(
        workspace=workspace,
        repository=RepositoryFactory(workspace=workspace),
        requested_by=requested_by,
        risk_level=risk,
    )
    run = Run.objects.create(task=task, run_no=1, status=Run.Status.AWAITING_APPROVAL)
    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256=SHA)
    patch = Patch.objects.create(run=run, diff_sha256=SHA, diff_artifact=diff)
    Approval.objects.create(
        run=run, patch=patch, patch_sha256=SHA, expires_at=timezone.now() + timedelta(hours=1)
    )
    return run


def _client(workspace: Workspace, role: str, username: str = "") -> APIClient:
    user = UserFactory(**({"username": username} if username else {}))
    Membership.objects.create(workspace=workspace, user=user, role=role)
    client = APIClient()
    client.force_authenticate(user)
    return client


def _approve(client: APIClient, run: Run, **body: Any) -> Any:
    return client.post(f"/api/runs/{run.id}/approve/", body, format="json")


def _pending(run: Run) -> bool:
    return Approval.objects.get(run=run).status == Approval.Status.PENDING


def test_a_plain_member_may_not_approve_by_default():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace)

    refused = _approve(_client(workspace, Membership.Role.MEMBER), run)

    assert refused.status_code == 403
    assert refused.json()["code"] == "approval_not_allowed"
    assert _pending(run)
    assert not run.events.filter(type__startswith="agent.approval.").exists()


def test_an_approver_approves_and_the_decision_is_on_the_timeline():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace)

    response = _approve(_client(workspace, Membership.Role.APPROVER, "vera"), run, comment="lgtm")

    assert response.status_code == 202
    event = run.events.get(type="agent.approval.approved")
    assert (event.actor, event.data["comment"], event.data["patch_sha256"]) == (
        "vera",
        "lgtm",
        SHA,
    )


def test_a_workspace_may_let_every_member_approve():
    workspace = WorkspaceFactory(approval_by=Workspace.ApprovalBy.MEMBERS)
    run = _awaiting(workspace=workspace)

    assert _approve(_client(workspace, Membership.Role.MEMBER), run).status_code == 202


def test_the_requester_may_not_approve_their_own_high_risk_run():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace, requested_by="ric", risk=Task.Risk.HIGH)
    requester = _client(workspace, Membership.Role.ADMIN, "ric")

    refused = _approve(requester, run)
    withdrawn = requester.post(f"/api/runs/{run.id}/reject/", {}, format="json")

    assert refused.status_code == 403
    assert refused.json()["code"] == "self_approval_not_allowed"
    # Stopping their own change is always allowed.
    assert withdrawn.status_code == 202
    assert run.events.filter(type="agent.approval.rejected", actor="ric").exists()


def test_a_workspace_may_allow_self_approval_of_high_risk_runs():
    workspace = WorkspaceFactory(approval_self_high_risk=True)
    run = _awaiting(workspace=workspace, requested_by="ric", risk=Task.Risk.HIGH)

    assert _approve(_client(workspace, Membership.Role.APPROVER, "ric"), run).status_code == 202


def test_only_the_diff_that_was_shown_is_approved():
    workspace = WorkspaceFactory()
    run = _awaiting(workspace=workspace)

    stale = _approve(_client(workspace, Membership.Role.APPROVER), run, patch_sha256="b" * 64)

    assert stale.status_code == 409
    assert stale.json()["code"] == "approval_stale"
    assert _pending(run)


def test_workspace_admins_set_the_policy_over_the_api():
    workspace = WorkspaceFactory()
    admin = _client(workspace, Membership.Role.ADMIN)

    response = admin.patch(
        f"/api/workspaces/{workspace.slug}/",
        {"approval_by": "members", "approval_self_high_risk": True},
        format="json",
    )

    workspace.refresh_from_db()
    assert response.status_code == 200, response.content
    assert (workspace.approval_by, workspace.approval_self_high_risk) == ("members", True)


def test_the_console_has_no_bulk_approval(client: Any):
    operator = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(operator)
    run = _awaiting(workspace=WorkspaceFactory())

    listing = client.get("/admin/runs/run/")
    bulk = client.post(
        "/admin/runs/run/",
        {"action": "approve_runs", ACTION_CHECKBOX_NAME: [str(run.pk)], "index": 0},
    )
    blind = client.post(f"/admin/runs/run/{run.pk}/operate/approve/", {})
    page = client.get(f"/admin/runs/run/{run.pk}/change/").content.decode()

    assert 'value="approve_runs"' not in listing.content.decode()
    assert bulk.status_code in (200, 302)
    assert _pending(run)  # neither in bulk nor without the diff's hash
    assert blind.status_code == 302 and _pending(run)
    # On the run page, the buttons stand with the diff they approve.
    panel = page[page.index('id="approval"') :]
    assert panel.index('id="approval-diff"') < panel.index('id="action-approve"')
    assert f'name="patch_sha256" value="{SHA}"' in panel
    shown = client.post(f"/admin/runs/run/{run.pk}/operate/approve/", {"patch_sha256": SHA})
    assert shown.status_code == 302 and not _pending(run)
