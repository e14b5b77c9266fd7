"""The steps running in one process have their leases renewed together, by one statement;
a lease another worker took is left out of the answer, and its step writes nothing more."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import engine
from runs.heartbeat import Heartbeat, heartbeats_renew
from runs.lease import LeaseLost, lease_acquire
from runs.models import Run
from runs.protocol import StepContext
from tests.conftest import wait_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 6


def _leased_runs(workspace, n: int) -> list[tuple[Run, engine.Lease]]:
    leased = []
    for i in range(n):
        run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
        lease = lease_acquire(run_id=run.pk, step_no=0, owner=f"worker-{i}")
        assert lease is not None
        leased.append((run, lease))
    return leased


def _take_over(run: Run) -> None:
    """Another worker takes the run, as after the lease ran out (the reaper moved on)."""
    Run.objects.filter(pk=run.pk).update(lease_owner="another-worker", attempt=run.attempt + 5)


@pytest.mark.sql_shape
def test_the_leases_of_a_process_are_renewed_by_one_statement(workspace):
    leased = _leased_runs(workspace, STEPS)
    before = timezone.now()
    heartbeats = [Heartbeat(lease) for _, lease in leased]
    with CaptureQueriesContext(connection) as queries:
        heartbeats_renew(heartbeats)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert "RETURNING" in queries[0]["sql"]
    renewed = Run.objects.filter(pk__in=[run.pk for run, _ in leased])
    assert all(run.heartbeat_at > before for run in renewed)
    assert not any(h.should_stop() for h in heartbeats)


def test_concurrent_steps_share_their_renewal_and_a_taken_lease_stops_writing(workspace):
    leased = _leased_runs(workspace, STEPS)
    taken_run, taken_lease = leased[0]
    started = threading.Barrier(STEPS + 1)
    finish = threading.Event()
    # Steps that started at one moment (their renewals fall due together).
    heartbeats = [Heartbeat(lease) for _, lease in leased]

    def step(heartbeat: Heartbeat) -> None:
        # A step of its own thread, as in the threads pool: in its heartbeat until told.
        with heartbeat:
            started.wait()
            finish.wait(timeout=60)
        connection.close()

    threads = [threading.Thread(target=step, args=(heartbeat,)) for heartbeat in heartbeats]
    for thread in threads:
        thread.start()
    started.wait()
    entered = timezone.now()
    _take_over(taken_run)
    try:

        def renewed() -> list[Run] | None:
            rows = list(Run.objects.filter(pk__in=[run.pk for run, _ in leased[1:]]))
            return rows if all(r.heartbeat_at > entered for r in rows) else None

        rows = wait_for(renewed, timeout=30, message="the steps' renewals")
        # One statement renewed them: one moment for all.
        assert len({r.heartbeat_at for r in rows}) == 1
        wait_for(lambda: heartbeats[0].lost, timeout=30, message="the taken lease seen")
        assert heartbeats[0].should_stop()
        assert not any(heartbeats[i].should_stop() for i in range(1, STEPS))
    finally:
        finish.set()
        for thread in threads:
            thread.join()

    # The step whose lease was taken writes nothing: a mid-step checkpoint is refused and
    # the row keeps what the other worker wrote.
    ctx = StepContext(
        Run.objects.select_related("task__repository").get(pk=taken_run.pk), taken_lease
    )
    ctx.heartbeat = heartbeats[0]
    with pytest.raises(LeaseLost):
        ctx.check_cancelled()
    with pytest.raises(LeaseLost), ctx.fenced():
        Run.objects.filter(pk=taken_run.pk).update(failure_detail="written without a lease")
    row = Run.objects.get(pk=taken_run.pk)
    assert (row.lease_owner, row.failure_detail) == ("another-worker", "")
