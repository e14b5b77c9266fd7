"""The step protocol (docs/design.md §7): lease, check, do one step, commit, dispatch, return.

A wake-up message names a run and the step number it was sent for. The worker takes the
run's lease with a conditional UPDATE that also bumps the fencing token (``attempt``); a
message whose step already happened, or whose run is leased by someone else, does
nothing. The step's side effect happens outside any transaction while a heartbeat thread
renews the lease and watches for cancellation. Then one transaction writes the new state,
the checkpoint, the timeline and the outbox, fenced on (owner, attempt): a worker that
lost its lease writes nothing. The next step is dispatched on commit.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from agentplatform import observability
from jobs import redis_round
from runs import dispatch
from runs.agent.budget import budget_enforce
from runs.ending import after_terminal, task_status_follow, terminal_events
from runs.heartbeat import Heartbeat
from runs.lease import (
    Lease,
    LeaseLost,
    lease_acquire_loaded,
    lease_continue_loaded,
    lease_fenced,
    lease_release,
    worker_identity,
)
from runs.logs import log
from runs.models import Run
from runs.protocol import Outcome, RunCancelled, StepContext, StepFailed
from runs.state import STEPPABLE, TERMINAL, transition_check
from runs.steps import HANDLERS
from runs.timeline import PendingEvent, events_record

S = Run.Status


def budget_check(ctx: StepContext) -> None:
    """Fail (or time out) the run when its task's cumulative wall-clock or cost is spent.

    Not in running, which checks before every model call and submits the working copy
    when these run out, and not for a patch submitted that way: verifying and judging
    it is what the submission is for.
    """
    if ctx.run.status == S.RUNNING or ctx.checkpoint.get("submitted_by"):
        return
    budget_enforce(ctx, "wall_clock_seconds", "cost_usd")


@dataclass
class StepSlice:
    """How long a worker may go on with a run's next steps once it holds its lease, and
    the step it is at (kept up to date by ``step_execute``, so that a retry after an
    error names the step that met it)."""

    seconds: float
    step_no: int = -1


def step_execute(
    *,
    run_id: str,
    step_no: int,
    owner: str | None = None,
    slice: StepSlice | None = None,
    retry: bool = False,
) -> str:
    """Execute a step of a run if this message is still current. Returns what happened.

    With a ``slice`` the worker keeps going: while the slice lasts and the next step is
    on this message's queue or on another one this worker consumes
    (``dispatch.served_here``), the step's commit keeps the lease (renewed) instead of
    sending a wake-up, and the next step starts here from the rows the commit left.
    Each step is still its own fenced commit; if this process dies between two of them,
    the lease runs out and the reaper recovers the run as after any crash.

    ``retry``: this is the retry of ``step_no`` after an error, by the same ``owner``
    when the database went away. That step's commit may have landed with its answer
    lost on the way back (the connection cut after PostgreSQL committed): the run is
    then one step on, its lease kept by this owner or given back, and no wake-up was
    sent for that step, so the retry takes it.

    Raises on unexpected errors after giving the lease back, so the Celery task retries.
    """
    owner = owner or worker_identity()
    if slice is not None:
        slice.step_no = step_no
    acquired = lease_acquire_loaded(run_id=run_id, step_no=step_no, owner=owner)
    if acquired is None and retry:
        acquired = lease_acquire_loaded(run_id=run_id, step_no=step_no + 1, owner=owner)
        if acquired is not None:
            log.warning("step.commit_found_landed", run_id=run_id, step_no=step_no)
            if slice is not None:
                slice.step_no = step_no + 1
    if acquired is None:
        return "skipped"
    slice_end = time.monotonic() + (slice.seconds if slice is not None else 0.0)
    while True:
        lease, run = acquired
        ctx = StepContext(run, lease)
        ctx.slice_end = slice_end
        result = _step_once(ctx)
        if not ctx.lease_kept:
            return result
        if slice is not None:
            # From here on the kept lease is the next step's: a retry after an error
            # (say, the database going away before that step could load) takes it back.
            slice.step_no = lease.step_no + 1
        acquired = ctx.next_loaded or lease_continue_loaded(lease)
        if acquired is None:
            # Only the reaper or a retry of this very message takes a lease that was
            # renewed a moment ago: it is theirs now.
            log.warning("step.lease_lost_between_steps", run_id=run_id, step_no=lease.step_no)
            return "lease_lost"


def _step_once(ctx: StepContext) -> str:
    """One step under the lease ``ctx`` holds: the handler, then the fenced commit."""
    run, lease = ctx.run, ctx.lease
    run_id, step_no = str(run.id), lease.step_no
    observability.step_bind(run, step_no)
    try:
        if run.cancel_requested_at is not None:
            outcome = Outcome(to=S.CANCELLED, reason="cancelled", detail=run.cancel_reason)
        else:
            budget_check(ctx)
            handler = HANDLERS[run.status]
            with Heartbeat(lease) as heartbeat, observability.step_timed(run.status):
                ctx.heartbeat = heartbeat
                outcome = handler(ctx)
            if heartbeat.lost:
                raise LeaseLost(f"lease on run {run.id} lost during the step")
    except RunCancelled:
        stopped = _stopped_outcome(ctx)
        if stopped is None:
            log.warning("step.stopped_lease_uncertain", run_id=run_id, step_no=step_no)
            return "lease_lost"
        outcome = stopped
    except StepFailed as failure:
        outcome = Outcome(to=failure.status, reason=failure.reason, detail=failure.detail)
    except LeaseLost:
        log.warning("step.lease_lost", run_id=run_id, step_no=step_no)
        return "lease_lost"
    except Exception:
        # Unknown trouble: give the lease back so the retry (or the reaper) can proceed.
        with contextlib.suppress(Exception):
            close_old_connections()
            lease_release(lease, count_retry=True)
        raise
    try:
        return step_commit(ctx, outcome)
    except LeaseLost:
        log.warning("step.lease_lost_at_commit", run_id=run_id, step_no=step_no)
        return "lease_lost"


def _stopped_outcome(ctx: StepContext) -> Outcome | None:
    """The outcome of a step that stopped on ``should_stop``: cancelled only when the run
    row records a cancellation request and the lease is still this worker's; otherwise
    None, and the step writes nothing.

    A failed heartbeat, a lost connection or an exhausted pool leave the lease uncertain:
    the step stops too, but that is no request of anybody's. The lease then runs out and
    the reaper hands the run on; a recorded request is seen by the next step.
    """
    run, heartbeat = ctx.run, ctx.heartbeat
    if heartbeat is not None and heartbeat.lost:
        return None
    try:
        requested = Run.objects.filter(pk=run.pk, cancel_requested_at__isnull=False).values_list(
            "cancel_reason", flat=True
        )
        reason = requested.first()
    except DatabaseError:
        with contextlib.suppress(Exception):
            connection.close()
        return None
    if reason is None:
        return None
    return Outcome(to=S.CANCELLED, reason="cancelled", detail=reason)


def step_commit(ctx: StepContext, outcome: Outcome) -> str:
    """Write the step's outcome, fenced on the lease, and dispatch the next step (or keep
    the lease for it), in one transaction (``_commit_in_transaction``)."""
    run, lease = ctx.run, ctx.lease
    now = timezone.now()
    if outcome.noop:
        lease_release(lease)
        return "noop"
    source = run.status
    target = outcome.to
    status = target or source
    keep = (
        time.monotonic() < ctx.slice_end
        and status in STEPPABLE
        and not outcome.wait
        and dispatch.served_here(status=status, source=source)
    )
    fields: dict[str, Any] = {
        "step_no": F("step_no") + 1,
        # A kept lease is renewed for the next step; otherwise it is given back.
        "lease_owner": lease.owner if keep else "",
        "lease_until": now + timedelta(seconds=settings.RUN_LEASE_SECONDS) if keep else None,
        "heartbeat_at": now,
        "checkpoint": ctx.checkpoint,
        **outcome.fields,
    }
    if target is not None:
        transition_check(source, target)
        fields.update(status=target, status_changed_at=now)
        if source == S.QUEUED:
            fields["started_at"] = now
        if target in TERMINAL:
            fields["finished_at"] = now
            if target != S.COMPLETED:
                fields["failure_reason"] = outcome.reason or target
                fields["failure_detail"] = outcome.detail[:5000]
    events = list(ctx.events)
    if target is not None:
        events.append(
            PendingEvent(
                "agent.run.status.changed",
                {"from": source, "to": target, "reason": outcome.reason},
            )
        )
    _commit_in_transaction(ctx, outcome, fields=fields, events=events, keep=keep)
    ctx.lease_kept = keep
    log.info(
        "step.committed",
        run_id=str(run.id),
        step_no=lease.step_no,
        source=source,
        target=status,
    )
    return status


def _commit_in_transaction(
    ctx: StepContext,
    outcome: Outcome,
    *,
    fields: dict[str, Any],
    events: list[PendingEvent],
    keep: bool,
) -> None:
    """Any step's commit: one transaction, the fenced UPDATE first."""
    run, lease = ctx.run, ctx.lease
    source, target = run.status, outcome.to
    status = target or source
    # The fenced UPDATE also reserves the sequence numbers of the events known by now:
    # one statement instead of two, under the row lock it takes anyway.
    reserved = len(events)
    fields["last_sequence_no"] = F("last_sequence_no") + reserved
    # The commit's wake-ups in one round trip (redis_round), sent once the block ends.
    with redis_round.together(), transaction.atomic():
        last = _fenced_update(lease, source, fields)
        if last is None:
            raise LeaseLost(f"lease on run {run.id} lost before commit")
        for write in ctx._commit_writes:
            write()
        if target is not None and target not in TERMINAL:
            task_status_follow(ctx.task, source=source, target=target)
        if target is not None:
            run.status = target
            if target in TERMINAL:
                closing, after = terminal_events(ctx, target, outcome)
                events.extend(closing)
        next_step = lease.step_no + 1
        # The next step's wake-up is the first thing sent on commit (before the relay's
        # and the live views' wake-ups): it is what the run waits for.
        # (With the lease kept, this worker takes the next step itself.)
        if not keep and status in STEPPABLE and not outcome.wait:
            dispatch.run_wake_on_commit(run_id=run.id, step_no=next_step, status=status)
        events_record(task=ctx.task, run=run, events=events, reserved=(last, reserved))
        if target in TERMINAL:
            transaction.on_commit(lambda: after_terminal(run.id, after))
        for action in ctx._after_commit:
            transaction.on_commit(action)


def _fenced_update(lease: Lease, source: str, fields: dict[str, Any]) -> int | None:
    """The step's fenced UPDATE of its run; the run's ``last_sequence_no`` after it, or
    None when the lease is no longer this worker's (nothing was written). Inside the
    commit's transaction: the row stays locked between the two statements."""
    fenced = lease_fenced(lease).filter(status=source, step_no=lease.step_no)
    if fenced.update(**fields) != 1:
        return None
    return int(Run.objects.filter(pk=lease.run_id).values_list("last_sequence_no", flat=True)[0])


def run_drive_inline(*, run_id: uuid.UUID | str, max_steps: int = 500) -> Run:
    """Advance a run step by step in this process until it stops being steppable.

    The same protocol a worker follows (lease, step, fenced commit); the wake-up messages
    the commits send are duplicates this loop has already acted on and do nothing.
    For debugging a run from a shell and for tests that drive a run directly.
    """
    for _ in range(max_steps):
        run = Run.objects.get(pk=run_id)
        if run.status not in STEPPABLE:
            return run
        if step_execute(run_id=str(run.id), step_no=run.step_no) == "skipped":
            time.sleep(0.05)  # someone else holds the lease; let it expire or finish
    return Run.objects.get(pk=run_id)
