"""The step protocol: fenced leases, stale and duplicate messages, cancellation."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.models import OutboxEvent
from runs.engine import step_commit, step_execute
from runs.lease import LeaseLost, lease_acquire, lease_acquire_loaded, lease_renew
from runs.models import Run, Task
from runs.protocol import Outcome, StepContext
from runs.services import run_cancel_request
from runs.state import TERMINAL
from runs.timeline import event_record

pytestmark = pytest.mark.django_db
S = Run.Status


def test_a_step_advances_the_run_once(run):
    assert step_execute(run_id=str(run.id), step_no=0) == S.PREPARING
    run.refresh_from_db()
    assert (run.status, run.step_no, run.attempt) == (S.PREPARING, 1, 1)
    assert run.lease_owner == "" and run.lease_until is None


def test_a_duplicate_message_is_a_no_op(run):
    step_execute(run_id=str(run.id), step_no=0)
    events = run.events.count()
    assert step_execute(run_id=str(run.id), step_no=0) == "skipped"
    run.refresh_from_db()
    assert (run.status, run.step_no, run.events.count()) == (S.PREPARING, 1, events)


def test_a_message_for_a_future_step_is_a_no_op(run):
    assert step_execute(run_id=str(run.id), step_no=5) == "skipped"
    run.refresh_from_db()
    assert run.status == S.QUEUED and run.attempt == 0


def test_a_run_leased_by_another_worker_is_left_alone(run):
    assert lease_acquire(run_id=run.id, step_no=0, owner="other") is not None
    assert step_execute(run_id=str(run.id), step_no=0) == "skipped"
    run.refresh_from_db()
    assert run.lease_owner == "other" and run.status == S.QUEUED


def test_a_worker_that_lost_its_lease_writes_nothing(run):
    lease = lease_acquire(run_id=run.id, step_no=0, owner="stalled")
    # The lease expires and another worker takes the run (fencing token moves on).
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timezone.timedelta(1))
    assert lease_acquire(run_id=run.id, step_no=0, owner="successor") is not None
    run.refresh_from_db()
    events = run.events.count()

    with pytest.raises(LeaseLost):
        step_commit(StepContext(run, lease), Outcome(to=S.PREPARING))

    run.refresh_from_db()
    assert (run.status, run.lease_owner, run.events.count()) == (S.QUEUED, "successor", events)
    assert lease_renew(lease) is None


def test_a_heartbeat_returns_the_cancellation_flag(run):
    lease = lease_acquire(run_id=run.id, step_no=0, owner="w")
    assert lease_renew(lease) is False
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    assert lease_renew(lease) is True


def test_a_cancelled_run_ends_cancelled_at_its_next_step(run):
    assert run_cancel_request(run=run, by="alice", reason="wrong repo")
    assert step_execute(run_id=str(run.id), step_no=0) == S.CANCELLED
    run.refresh_from_db()
    assert run.status == S.CANCELLED and run.failure_reason == "cancelled"
    types = list(run.events.values_list("type", flat=True))
    assert "agent.run.cancel.requested" in types and "agent.run.cancelled" in types
    assert Task.objects.get(pk=run.task_id).status == Task.Status.CANCELLED
    assert run_cancel_request(run=run, by="alice") is False


# Committed rows, as in production: a step that runs longer than a heartbeat interval
# renews its lease from another connection, which must see the run.
@pytest.mark.django_db(transaction=True)
def test_each_state_is_passed_through_in_process(run):
    statuses = []
    for _ in range(20):
        run.refresh_from_db()
        if run.status in TERMINAL:
            break
        statuses.append(step_execute(run_id=str(run.id), step_no=run.step_no))
    assert statuses == [
        "preparing",
        "context_loading",
        "planning",
        "running",
        "verifying",
        "judging",
        "creating_pr",
        "completed",
    ]


def test_a_step_numbers_its_events_after_the_timeline_without_gaps(run):
    # The fenced UPDATE reserves the numbers of the step's own events and its status
    # change; a terminal step's closing facts are reserved after them in the same commit.
    with transaction.atomic():
        event_record(task=run.task, run=run, type="agent.test.before")
    lease = lease_acquire(run_id=run.id, step_no=0, owner="w")
    ctx = StepContext(Run.objects.select_related("task").get(pk=run.pk), lease)
    ctx.emit("agent.test.one")
    ctx.emit("agent.test.two")
    step_commit(ctx, Outcome(to=S.CANCELLED, reason="cancelled"))

    rows = list(run.events.order_by("sequence_no").values_list("sequence_no", "type"))
    assert [n for n, _ in rows] == list(range(1, len(rows) + 1))
    assert [t for _, t in rows][:4] == [
        "agent.test.before",
        "agent.test.one",
        "agent.test.two",
        "agent.run.status.changed",
    ]
    assert {t for _, t in rows[4:]} == {"agent.run.cancelled", "agent.task.cancelled"}
    run.refresh_from_db()
    assert run.last_sequence_no == len(rows)
    published = {
        row.payload["sequence"] for row in OutboxEvent.objects.filter(partition_key=str(run.id))
    }
    assert published == {n for n, _ in rows}


def test_a_stale_commit_reserves_no_sequence_numbers(run):
    lease = lease_acquire(run_id=run.id, step_no=0, owner="stalled")
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timezone.timedelta(1))
    assert lease_acquire(run_id=run.id, step_no=0, owner="successor") is not None
    ctx = StepContext(Run.objects.select_related("task").get(pk=run.pk), lease)
    ctx.emit("agent.test.never")
    with pytest.raises(LeaseLost):
        step_commit(ctx, Outcome(to=S.PREPARING))
    run.refresh_from_db()
    assert run.last_sequence_no == 0 and not run.events.exists()
    assert not OutboxEvent.objects.filter(partition_key=str(run.id)).exists()


def test_the_lease_statement_refuses_a_stale_or_busy_step_and_loads_nothing(run):
    assert lease_acquire_loaded(run_id=str(run.id), step_no=3, owner="w") is None
    assert lease_acquire_loaded(run_id=str(run.id), step_no=0, owner="w") is not None
    # Another worker while the lease is held; then a message for the step after it.
    assert lease_acquire_loaded(run_id=str(run.id), step_no=0, owner="other") is None
    Run.objects.filter(pk=run.pk).update(status=S.COMPLETED, lease_owner="", lease_until=None)
    assert lease_acquire_loaded(run_id=str(run.id), step_no=0, owner="w") is None
    run.refresh_from_db()
    assert (run.attempt, run.lease_owner) == (1, "")
