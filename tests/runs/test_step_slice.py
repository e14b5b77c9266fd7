"""A worker goes on with a run's next steps itself for a slice of time (RUN_STEP_SLICE_SECONDS).

Each step is still its own fenced commit. The slice ends at a step another queue serves,
at a wait, at a cancellation and when its time is up, and then a wake-up is sent as
after any step. A step that fails inside the slice is retried as that step.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from jobs import workers
from runs import dispatch, engine, protocol
from runs.engine import StepSlice, step_execute
from runs.models import Run, Task
from runs.protocol import Outcome
from runs.reaper import zombies_reap
from runs.tasks import run_step
from tests.conftest import database_backend_terminate

pytestmark = pytest.mark.django_db(transaction=True)
S = Run.Status

CHAIN = [
    S.QUEUED,
    S.PREPARING,
    S.CONTEXT_LOADING,
    S.PLANNING,
    S.RUNNING,
    S.VERIFYING,
    S.JUDGING,
    S.CREATING_PR,
    S.COMPLETED,
]


@pytest.fixture
def handlers(monkeypatch):
    """No-op handlers moving a run along CHAIN; ``before[status]`` runs first in a step."""
    before: dict[str, Any] = {}
    seen: list[tuple[str, int, int]] = []

    def make(source: str, target: str) -> Any:
        def handler(ctx: protocol.StepContext) -> Outcome:
            seen.append((source, ctx.step_no, ctx.lease.attempt))
            if source in before:
                before[source](ctx)
            ctx.checkpoint[source] = ctx.step_no
            return Outcome(to=target)

        return handler

    table = {source: make(source, target) for source, target in itertools.pairwise(CHAIN)}
    monkeypatch.setattr(engine, "HANDLERS", table)
    return before, seen


@pytest.fixture
def wakes(monkeypatch):
    """The wake-up messages sent, as (step_no, queue); they are sent for real too."""
    sent: list[tuple[int, str]] = []
    real = dispatch.run_wake

    def run_wake(*, run_id: Any, step_no: int, status: str = "") -> None:
        sent.append((step_no, dispatch.queue_for(status)))
        real(run_id=run_id, step_no=step_no, status=status)

    monkeypatch.setattr(dispatch, "run_wake", run_wake)
    return sent


def test_a_slice_takes_the_steps_of_one_queue_each_committed_on_its_own(run, handlers, wakes):
    _before, seen = handlers

    assert step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30)) == S.VERIFYING

    run.refresh_from_db()
    # Five steps on the "agent" queue under one lease; verifying is another queue's.
    assert [source for source, _, _ in seen] == CHAIN[:5]
    assert [step for _, step, _ in seen] == [0, 1, 2, 3, 4]
    assert {attempt for _, _, attempt in seen} == {1}
    assert (run.status, run.step_no, run.attempt) == (S.VERIFYING, 5, 1)
    assert run.lease_owner == "" and run.lease_until is None
    assert run.checkpoint == {source: n for n, source in enumerate(CHAIN[:5])}
    assert wakes == [(5, "verify")]
    changes = list(
        run.events.filter(type="agent.run.status.changed")
        .order_by("sequence_no")
        .values_list("data__to", flat=True)
    )
    assert changes == CHAIN[1:6]
    sequence = list(run.events.order_by("sequence_no").values_list("sequence_no", flat=True))
    assert sequence == list(range(1, len(sequence) + 1))


def test_a_worker_that_consumes_the_next_queue_too_goes_on_without_a_wake_up(
    run, handlers, wakes, monkeypatch
):
    """Deployed with ``-Q agent,verify``: the verify step is this worker's as well, so no
    message goes through the broker back to it; each step is still its own commit."""
    from types import SimpleNamespace

    from celery.app.amqp import Queues
    from kombu import Queue

    from agentplatform.celery import _worker_queues_settle

    monkeypatch.setattr(workers, "_queues_served", frozenset())
    queues = Queues([Queue(name) for name in ("agent", "verify", "events", "webhooks")])
    queues.select(["agent", "verify"])
    _worker_queues_settle(
        instance=SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=queues)))
    )
    _before, seen = handlers

    assert step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30)) == S.COMPLETED

    run.refresh_from_db()
    assert [source for source, _, _ in seen] == CHAIN[:-1]
    assert {attempt for _, _, attempt in seen} == {1}
    assert (run.status, run.step_no) == (S.COMPLETED, len(CHAIN) - 1)
    assert wakes == []
    changes = run.events.filter(type="agent.run.status.changed").order_by("sequence_no")
    assert list(changes.values_list("data__to", flat=True)) == CHAIN[1:]


def test_a_worker_of_the_agent_queue_alone_still_hands_verifying_on(
    run, handlers, wakes, monkeypatch
):
    monkeypatch.setattr(workers, "_queues_served", frozenset({"agent", "events"}))

    assert step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30)) == S.VERIFYING
    assert wakes == [(5, "verify")]


def test_each_step_of_a_slice_is_committed_before_the_next_begins(run, handlers):
    before, _seen = handlers
    committed: list[tuple[str, int, str]] = []

    def look(ctx: protocol.StepContext) -> None:
        # From another connection's point of view (autocommit: no transaction is open).
        row = Run.objects.filter(pk=ctx.run.pk).values_list("status", "step_no", "lease_owner")
        committed.append(row.get())

    before[S.PLANNING] = look
    before[S.RUNNING] = look

    step_execute(run_id=str(run.id), step_no=0, owner="w1", slice=StepSlice(seconds=30))

    assert committed == [(S.PLANNING, 3, "w1"), (S.RUNNING, 4, "w1")]


def test_without_a_slice_one_step_is_taken_and_the_next_is_woken(run, handlers, wakes):
    _before, seen = handlers

    assert step_execute(run_id=str(run.id), step_no=0) == S.PREPARING
    assert step_execute(run_id=str(run.id), step_no=1, slice=StepSlice(seconds=0)) == (
        S.CONTEXT_LOADING
    )

    assert len(seen) == 2
    assert wakes == [(1, "agent"), (2, "agent")]


def test_a_slice_ends_when_its_time_is_up(run, handlers, wakes):
    before, seen = handlers
    before[S.PREPARING] = lambda ctx: time.sleep(0.4)

    step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=0.3))

    run.refresh_from_db()
    assert [source for source, _, _ in seen] == [S.QUEUED, S.PREPARING]
    assert (run.status, run.step_no, run.lease_owner) == (S.CONTEXT_LOADING, 2, "")
    assert wakes == [(2, "agent")]


def test_a_cancellation_between_two_steps_ends_the_run_at_the_next(run, handlers, wakes):
    before, seen = handlers

    def cancel_from_outside(ctx: protocol.StepContext) -> None:
        from runs.services import run_cancel_request

        assert run_cancel_request(run=Run.objects.get(pk=ctx.run.pk), by="alice", reason="stop")

    before[S.PREPARING] = cancel_from_outside

    assert step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30)) == S.CANCELLED

    run.refresh_from_db()
    assert [source for source, _, _ in seen] == [S.QUEUED, S.PREPARING]
    assert run.status == S.CANCELLED and run.failure_detail == "stop"
    assert run.lease_owner == ""
    # Only the cancellation's own wake-up of the step under way (a no-op by now).
    assert wakes == [(1, "agent")]


def test_a_step_sees_what_changed_since_the_slice_began(run, handlers):
    before, _seen = handlers
    seen_instructions: list[str] = []

    def edit_task(ctx: protocol.StepContext) -> None:
        type(ctx.task).objects.filter(pk=ctx.task.pk).update(instruction="edited meanwhile")

    before[S.PREPARING] = edit_task
    before[S.CONTEXT_LOADING] = lambda ctx: seen_instructions.append(ctx.task.instruction)

    step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30))

    assert seen_instructions == ["edited meanwhile"]


def test_a_slice_stops_at_a_lease_it_no_longer_holds(run, handlers, wakes):
    before, seen = handlers

    def taken_over(ctx: protocol.StepContext) -> None:
        # As the reaper does after a lease ran out: a new fencing token.
        Run.objects.filter(pk=ctx.run.pk).update(attempt=ctx.lease.attempt + 1)

    before[S.PREPARING] = taken_over

    assert step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30)) == (
        "lease_lost"
    )

    run.refresh_from_db()
    assert [source for source, _, _ in seen] == [S.QUEUED, S.PREPARING]
    assert (run.status, run.step_no) == (S.PREPARING, 1)
    assert wakes == []


def test_a_step_that_fails_inside_a_slice_is_retried_as_that_step(
    run, handlers, settings, monkeypatch
):
    """The message was sent for step 0; the retry must name step 2, not a step long over
    (a retry of step 0 would be skipped and the run would wait for the stall sweep)."""
    before, seen = handlers
    settings.RUN_STEP_SLICE_SECONDS = 30
    failures = iter([RuntimeError("flaky tool")])

    def flaky(ctx: protocol.StepContext) -> None:
        exc = next(failures, None)
        if exc is not None:
            raise exc

    before[S.CONTEXT_LOADING] = flaky
    retried: list[tuple[Any, ...]] = []
    real_retry = run_step.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        retried.append(tuple(kwargs.get("args") or ()))
        return real_retry(*args, **kwargs)

    monkeypatch.setattr(run_step, "retry", retry)

    # Executed in this process (apply); the retry is applied the same way, at once.
    result = run_step.apply(args=(str(run.id), 0))

    assert result.successful(), result.traceback
    assert retried == [(str(run.id), 2)]
    run.refresh_from_db()
    assert (run.status, run.retries) == (S.VERIFYING, 1)
    sources = [source for source, _, _ in seen]
    assert sources == [S.QUEUED, S.PREPARING, S.CONTEXT_LOADING, S.CONTEXT_LOADING, *CHAIN[3:5]]


def test_a_process_that_dies_between_two_steps_leaves_the_run_to_the_reaper(
    run, handlers, wakes, settings
):
    """The commit kept the lease for a next step that never began: nothing is lost, the
    reaper recovers the run once the lease has run out and wakes its next step."""
    before, _seen = handlers

    class Died(BaseException):
        pass

    def die(ctx: protocol.StepContext) -> None:
        raise Died()

    before[S.CONTEXT_LOADING] = die

    with pytest.raises(Died):
        step_execute(run_id=str(run.id), step_no=0, owner="doomed", slice=StepSlice(seconds=30))

    run.refresh_from_db()
    assert (run.status, run.step_no, run.lease_owner) == (S.CONTEXT_LOADING, 2, "doomed")
    assert wakes == []
    assert zombies_reap().recovered == 0, "the lease is still valid"

    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timezone.timedelta(seconds=1))
    assert zombies_reap().recovered == 1

    run.refresh_from_db()
    assert (run.status, run.recoveries, run.lease_owner) == (S.CONTEXT_LOADING, 1, "")
    assert wakes == [(2, "agent")]


def test_a_database_lost_right_after_a_kept_commit_retries_the_next_step(
    run, handlers, settings, monkeypatch
):
    """The commit kept the lease for step 1, then the connection died before step 1 could
    load: the retry names step 1 and, as the same owner, takes its lease back at once."""
    before, seen = handlers
    settings.RUN_STEP_SLICE_SECONDS = 30
    before[S.QUEUED] = lambda ctx: ctx.after_commit(database_backend_terminate)
    retried: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real_retry = run_step.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        retried.append((tuple(kwargs.get("args") or ()), dict(kwargs.get("kwargs") or {})))
        return real_retry(*args, **kwargs)

    monkeypatch.setattr(run_step, "retry", retry)

    result = run_step.apply(args=(str(run.id), 0))

    assert result.successful(), result.traceback
    assert [args for args, _ in retried] == [(str(run.id), 1)]
    owner = retried[0][1]["owner"]
    run.refresh_from_db()
    assert (run.status, run.step_no, run.retries, run.recoveries) == (S.VERIFYING, 5, 0, 0)
    # Step 1 ran again if its first attempt met the dead connection at its commit (which
    # then wrote nothing); no other step ran twice.
    sources = [source for source, _, _ in seen]
    assert list(dict.fromkeys(sources)) == CHAIN[:5]
    assert sources.count(S.PREPARING) <= 2 and len(sources) - sources.count(S.PREPARING) == 4
    assert owner


@pytest.mark.parametrize("slice_seconds", [30, 0])
def test_a_commit_whose_answer_was_lost_is_taken_up_by_its_retry(
    run, handlers, settings, monkeypatch, slice_seconds
):
    """PostgreSQL committed step 0, then the connection went before the answer came back:
    the retry of step 0 finds the run one step on (its lease kept by the same owner, or
    given back with no wake-up sent) and goes on from there instead of skipping it."""
    _, seen = handlers
    settings.RUN_STEP_SLICE_SECONDS = slice_seconds
    real = engine._commit_in_transaction
    lost: list[int] = []

    def commit_then_lose_the_answer(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        if not lost:
            lost.append(1)
            database_backend_terminate()
            with connection.cursor() as cursor:  # the lost connection, as the caller meets it
                cursor.execute("SELECT 1")

    monkeypatch.setattr(engine, "_commit_in_transaction", commit_then_lose_the_answer)

    result = run_step.apply(args=(str(run.id), 0))

    assert result.successful(), result.traceback
    assert lost
    run.refresh_from_db()
    if slice_seconds:
        assert (run.status, run.step_no) == (S.VERIFYING, 5)
    else:
        assert (run.status, run.step_no, run.lease_owner) == (S.CONTEXT_LOADING, 2, "")
    # No step ran twice: step 0 landed once, and its retry went on with step 1.
    sources = [source for source, _, _ in seen]
    assert sources == CHAIN[: run.step_no]


# --- the commit ------------------------------------------------------------------------


def test_an_event_written_meanwhile_is_numbered_before_the_steps_events(run, handlers):
    """Another writer appended to the timeline during the step (a comment, a cancellation
    request): the commit numbers the step's events after the newcomer."""
    from django.db import transaction

    from runs.timeline import event_record

    before, _seen = handlers

    def someone_else_writes(ctx: protocol.StepContext) -> None:
        other = Run.objects.select_related("task").get(pk=ctx.run.pk)
        with transaction.atomic():
            event_record(task=other.task, run=other, type="agent.run.comment", data={"n": 1})

    before[S.PREPARING] = someone_else_writes

    step_execute(run_id=str(run.id), step_no=0, slice=StepSlice(seconds=30))

    run.refresh_from_db()
    assert (run.status, run.step_no) == (S.VERIFYING, 5)
    rows = list(run.events.order_by("sequence_no").values_list("sequence_no", "type", "data"))
    assert [n for n, _, _ in rows] == list(range(1, len(rows) + 1)) == list(range(1, 7))
    assert rows[1][1] == "agent.run.comment"
    assert [d["to"] for _, t, d in rows if t == "agent.run.status.changed"] == CHAIN[1:6]
    assert run.last_sequence_no == 6


def test_a_commit_that_fails_halfway_writes_nothing(run, handlers):
    """The commit's later INSERT fails (a timeline row already holds the number): the
    run's UPDATE made before it in the same transaction is rolled back with it."""
    from django.db import IntegrityError

    from runs.models import RunEvent

    before, _seen = handlers

    def plant(ctx: protocol.StepContext) -> None:
        RunEvent.objects.create(
            run_id=ctx.run.pk, sequence_no=ctx.run.last_sequence_no + 1, type="planted"
        )

    before[S.PREPARING] = plant

    with pytest.raises(IntegrityError):
        step_execute(run_id=str(run.id), step_no=0, owner="w", slice=StepSlice(seconds=30))

    run.refresh_from_db()
    assert (run.status, run.step_no, run.last_sequence_no) == (S.PREPARING, 1, 1)
    assert run.lease_owner == "w", "the lease is as the last commit left it"
    assert list(run.events.values_list("type", flat=True).order_by("sequence_no")) == [
        "agent.run.status.changed",
        "planted",
    ]
    from jobs.models import OutboxEvent

    assert OutboxEvent.objects.filter(type="agent.run.status.changed").count() == 1


def _drive(run: Run) -> Run:
    """Step the run (slices of 30 s) until it ends."""
    from runs.state import TERMINAL

    for _ in range(20):
        current = Run.objects.get(pk=run.pk)
        if current.status in TERMINAL:
            return current
        step_execute(run_id=str(run.id), step_no=current.step_no, slice=StepSlice(seconds=30))
    raise AssertionError("the run did not end")


def _ending(run: Run) -> dict[str, Any]:
    """What a run's end left: the task, the timeline, the outbox, the work item and the
    approvals."""
    from jobs.models import OutboxEvent, WorkItem
    from runs.ending import AFTER_TERMINAL
    from runs.models import Approval

    run.task.refresh_from_db()
    return {
        "run": (run.status, run.step_no, run.last_sequence_no, run.finished_at is not None),
        "task": (run.task.status, run.task.status_reason, sorted(run.task.usage)),
        "timeline": list(run.events.order_by("sequence_no").values_list("sequence_no", "type")),
        "outbox": sorted(
            OutboxEvent.objects.filter(partition_key=str(run.pk)).values_list("type", flat=True)
        ),
        "work": list(
            WorkItem.objects.filter(kind=AFTER_TERMINAL, key=str(run.pk)).values_list(
                "status", flat=True
            )
        ),
        "approvals": list(Approval.objects.filter(run=run).values_list("status", "reason")),
    }


def _approval_pending(run: Run) -> None:
    from runs.models import Approval, Artifact, Patch

    diff = Artifact.objects.create(run=run, kind="diff", name="diff", content="+x", sha256="a" * 64)
    patch = Patch.objects.create(run=run, diff_sha256="a" * 64, diff_artifact=diff)
    Approval.objects.create(
        run=run, patch=patch, patch_sha256="a" * 64, expires_at=timezone.now() + timedelta(hours=1)
    )


def test_feedback_batched_while_the_end_commits_gets_its_follow_up(run, handlers) -> None:
    """A reviewer's feedback arrives while the completing step's batch is on its way:
    ``task_followup`` saw the run active and holds the task's row; the batch waits for it
    at its task UPDATE, and its after-terminal item, decided after that UPDATE, sees the
    feedback. (Decided before it, the feedback was stranded on a task with no run.)"""
    import threading

    from django.db import connections, transaction

    from runs.services import task_followup
    from tests.conftest import wait_for
    from tests.runs.test_approval_races import _waiting_on_locks

    Run.objects.filter(pk=run.pk).update(status=S.CREATING_PR, step_no=7)
    Task.objects.filter(pk=run.task_id).update(status=Task.Status.RUNNING)
    outcome: list[Any] = []

    def end() -> None:
        try:
            outcome.append(step_execute(run_id=str(run.pk), step_no=7))
        except BaseException as error:
            outcome.append(error)
        finally:
            connections.close_all()

    with transaction.atomic():
        assert task_followup(task=run.task, feedback="also fix sub()", by="reviewer") is None
        ender = threading.Thread(target=end)
        ender.start()
        wait_for(lambda: _waiting_on_locks() >= 1, timeout=10, message="the end waiting")
    ender.join(20)
    assert outcome == [S.COMPLETED]
    run.refresh_from_db()
    assert run.status == S.COMPLETED
    assert run.task.runs.get(run_no=2).feedback == "also fix sub()"


def test_a_completing_commit_that_fails_writes_nothing(run, handlers):
    """The commit's last INSERT (the after-terminal work item) fails: the run's end, the
    voided approval, the task's status and the closing events go with it."""
    from django.db import IntegrityError

    from jobs.models import WorkItem
    from runs.ending import AFTER_TERMINAL

    before, _seen = handlers

    def plant(ctx: protocol.StepContext) -> None:
        _approval_pending(ctx.run)
        # Feedback waits, so the run's end records its item: the key is taken.
        Task.objects.filter(pk=ctx.task.pk).update(pending_feedback="also fix sub()")
        WorkItem.objects.create(
            kind=AFTER_TERMINAL, key=str(ctx.run.pk), args={}, queue="x", due_at=timezone.now()
        )

    before[S.CREATING_PR] = plant
    with pytest.raises(IntegrityError, match="workitem"):
        _drive(run)
    run.refresh_from_db()
    ending = _ending(run)
    assert ending["run"][0] == S.CREATING_PR
    assert ending["task"][0] != "completed"
    assert "agent.run.completed" not in [t for _, t in ending["timeline"]]
    assert ending["approvals"] == [("pending", "")]
