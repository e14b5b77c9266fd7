"""Approvals: expiry and approve never deadlock, a run's end voids its approval, and
waiting for a person does not use up the agent's wall-clock budget."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs.models import OutboxEvent
from runs.agent.budget import budget_used
from runs.ending import run_end_unleased
from runs.models import Approval, Artifact, Patch, Run
from runs.services import CommandRefused, approvals_expire, run_approve
from tests.conftest import wait_for
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _awaiting(workspace, *, expires_in: timedelta) -> tuple[Run, Approval]:
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256="a" * 64)
    patch = Patch.objects.create(run=run, diff_sha256="a" * 64, diff_artifact=diff)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    run.refresh_from_db()
    approval = Approval.objects.create(
        run=run, patch=patch, patch_sha256="a" * 64, expires_at=timezone.now() + expires_in
    )
    return run, approval


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views are a snapshot: refresh it.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def test_expiry_racing_an_approve_does_not_deadlock(workspace):
    run, approval = _awaiting(workspace, expires_in=timedelta(seconds=-1))
    alice = UserFactory(username="alice", is_superuser=True)
    errors: list[BaseException] = []
    results: dict[str, object] = {}

    def call(name, fn):
        try:
            results[name] = fn()
        except CommandRefused as exc:
            results[name] = exc.code
        except BaseException as exc:  # a deadlock surfaces as an OperationalError
            errors.append(exc)
        finally:
            connections.close_all()

    # Hold the run's row so both commands queue up behind it, approve first: it will
    # hold the run when it asks for the approval.
    with transaction.atomic():
        Run.objects.select_for_update().get(pk=run.pk)
        approve = threading.Thread(
            target=call, args=("approve", lambda: run_approve(run=run, by="alice", user=alice))
        )
        approve.start()
        wait_for(lambda: _waiting_on_locks() >= 1, timeout=10, message="approve waiting")
        expire = threading.Thread(target=call, args=("expire", approvals_expire))
        expire.start()
        wait_for(lambda: _waiting_on_locks() >= 2, timeout=10, message="expiry waiting")
    expire.join(20)
    approve.join(20)

    assert errors == []
    approval.refresh_from_db()
    # Exactly one decision won; the loser was refused cleanly.
    if approval.status == Approval.Status.EXPIRED:
        assert results == {"expire": 1, "approve": "no_pending_approval"}
    else:
        assert approval.status == Approval.Status.APPROVED
        assert results["expire"] == 0


def test_a_run_that_ends_voids_its_pending_approval_and_it_never_expires(workspace):
    run, approval = _awaiting(workspace, expires_in=timedelta(seconds=-1))
    assert run_end_unleased(run_id=run.pk, target=Run.Status.CANCELLED, reason="cancelled")

    approval.refresh_from_db()
    assert approval.status == Approval.Status.VOID
    assert approvals_expire() == 0
    assert not OutboxEvent.objects.filter(type="agent.approval.expired").exists()


def test_waiting_for_approval_does_not_count_against_the_wall_clock_budget(workspace):
    run, approval = _awaiting(workspace, expires_in=timedelta(days=7))
    now = timezone.now()
    # Started two hours ago; worked ten minutes, then waited for a person ever since.
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(hours=2))
    Approval.objects.filter(pk=approval.pk).update(
        requested_at=now - timedelta(hours=1, minutes=50)
    )
    run.refresh_from_db()
    used = budget_used(task=run.task, run=run, name="wall_clock_seconds")
    assert 590 <= used <= 620

    # Approved a minute ago: the minute since counts again.
    Approval.objects.filter(pk=approval.pk).update(
        status=Approval.Status.APPROVED, decided_at=now - timedelta(minutes=1)
    )
    used = budget_used(task=run.task, run=run, name="wall_clock_seconds")
    assert 650 <= used <= 680
