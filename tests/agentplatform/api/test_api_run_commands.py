"""Runs over the API: detail with budget and current step, the timeline cursor, and the
commands (cancel, approve, reject, retry) going through the services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from runs.models import Approval, Artifact, Membership, Patch, Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    task = TaskFactory(budget={"cost_usd": 2})
    return Run.objects.create(task=task, run_no=1)


@pytest.fixture
def client(run):
    user = UserFactory()
    Membership.objects.create(
        workspace=run.task.workspace, user=user, role=Membership.Role.APPROVER
    )
    api = APIClient()
    api.force_authenticate(user)
    return api


def _awaiting_approval(run: Run) -> Approval:
    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256="a" * 64)
    patch = Patch.objects.create(run=run, diff_sha256="a" * 64, diff_artifact=diff)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    return Approval.objects.create(
        run=run, patch=patch, patch_sha256="a" * 64, expires_at=timezone.now() + timedelta(hours=1)
    )


def test_run_detail_has_budget_usage_and_current_step(client, run):
    body = client.get(f"/api/runs/{run.id}/").json()

    assert body["budget"]["cost_usd"] == {"used": 0.0, "limit": 2.0}
    assert set(body["budget"]) >= {"model_turns", "agent_attempts", "wall_clock_seconds"}
    assert body["current_step"]["step_no"] == 0
    assert body["current_step"]["status"] == "queued"


def test_events_page_by_sequence_cursor_without_gaps_or_repeats(client, run):
    with transaction.atomic():
        events_record(
            task=run.task,
            run=run,
            events=[PendingEvent("agent.run.status.changed", {"i": i}) for i in range(7)],
        )
    seen, url = [], f"/api/runs/{run.id}/events/?limit=3"
    while url:
        page = client.get(url).json()
        seen += [event["sequence"] for event in page["results"]]
        url = page["next"]

    assert seen == list(range(1, 8))
    resumed = client.get(f"/api/runs/{run.id}/events/?after=5").json()
    assert [e["sequence"] for e in resumed["results"]] == [6, 7]
    assert resumed["next"] is None
    assert client.get(f"/api/runs/{run.id}/events/?after=x").status_code == 400


def test_cancel_records_the_request_and_refuses_an_ended_run(client, run):
    accepted = client.post(f"/api/runs/{run.id}/cancel/", {"reason": "wrong repo"}, format="json")
    run.refresh_from_db()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    refused = client.post(f"/api/runs/{run.id}/cancel/", {}, format="json")

    assert accepted.status_code == 202
    assert run.cancel_requested_at is not None
    assert run.cancel_reason == "wrong repo"
    assert run.events.filter(type="agent.run.cancel.requested").exists()
    assert refused.status_code == 409
    assert refused.json()["code"] == "run_terminal"


@pytest.mark.parametrize("command, status", [("approve", "approved"), ("reject", "rejected")])
def test_approval_decision_is_recorded(client, run, command, status):
    approval = _awaiting_approval(run)

    response = client.post(f"/api/runs/{run.id}/{command}/", {"comment": "ok"}, format="json")
    again = client.post(f"/api/runs/{run.id}/{command}/", {}, format="json")

    approval.refresh_from_db()
    assert response.status_code == 202
    assert approval.status == status
    assert run.events.filter(type=f"agent.approval.{status}").exists()
    assert again.status_code == 409
    assert again.json()["code"] == "no_pending_approval"


def test_retry_starts_a_new_run_only_when_none_is_active(client, run):
    refused = client.post(f"/api/runs/{run.id}/retry/")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
    accepted = client.post(f"/api/runs/{run.id}/retry/")

    assert refused.status_code == 409
    assert refused.json()["code"] == "run_active"
    assert accepted.status_code == 202
    new_run = Run.objects.get(pk=accepted.json()["run_id"])
    assert new_run.task_id == run.task_id
    assert new_run.run_no == 2
