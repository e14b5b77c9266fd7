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
import contextvars
import functools
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.db.models import F
from django.utils import timezone

from agentplatform import observability
from jobs import redis_round
from jobs.db_rows import instance_from_row
from runs import dispatch
from runs.logs import log
from runs.models import Approval, InputRequest, PullRequest, Repository, Run, Task, Workspace
from runs.state import ACTIVE, STEPPABLE, TERMINAL, transition_check
from runs.timeline import PendingEvent, events_record

S = Run.Status


class LeaseLost(Exception):
    """Another worker (or the reaper) owns the run now; this worker must write nothing."""


class RunCancelled(Exception):
    """The step was told to stop (``should_stop``): a recorded cancellation request, or a
    lease it can no longer vouch for. Only the former ends the run (``_stopped_outcome``).
    """


class StepFailed(Exception):
    """A categorised, non-retryable failure: the run ends failed with ``reason``."""

    def __init__(self, reason: str, detail: str = "", *, status: str = S.FAILED) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.status = status


class TransientStepError(Exception):
    """Infrastructure trouble (network, provider 5xx): retry the step with backoff."""


@dataclass(frozen=True)
class Lease:
    run_id: uuid.UUID
    owner: str
    attempt: int
    step_no: int


@dataclass
class Outcome:
    """What a step decided: a transition (``to``) or staying put to continue."""

    to: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""
    # Wait for an outside decision instead of dispatching the next step at once.
    wait: bool = False
    # Nothing happened (e.g. an approval is still pending): release the lease only.
    noop: bool = False


TERMINAL_RUN_EVENT: dict[str, str] = {
    S.COMPLETED: "agent.run.completed",
    S.FAILED: "agent.run.failed",
    S.CANCELLED: "agent.run.cancelled",
    S.TIMED_OUT: "agent.run.timed_out",
}
TERMINAL_TASK_STATUS: dict[str, str] = {
    S.COMPLETED: Task.Status.COMPLETED,
    S.FAILED: Task.Status.FAILED,
    S.CANCELLED: Task.Status.CANCELLED,
    S.TIMED_OUT: Task.Status.FAILED,
}
TERMINAL_TASK_EVENT: dict[str, str] = {
    S.COMPLETED: "agent.task.completed",
    S.FAILED: "agent.task.failed",
    S.CANCELLED: "agent.task.cancelled",
    S.TIMED_OUT: "agent.task.failed",
}


def worker_identity() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _lease_update(*, run_id: uuid.UUID | str, step_no: int, owner: str) -> tuple[str, list[Any]]:
    """The conditional UPDATE that takes a run's lease for ``step_no`` (no RETURNING)."""
    now = timezone.now()
    table = Run._meta.db_table
    active = sorted(ACTIVE)
    statement = (
        f"UPDATE {table} SET lease_owner = %s, lease_until = %s, heartbeat_at = %s, "  # noqa: S608 - table name is ours
        "attempt = attempt + 1, wakes = 0 "
        f"WHERE id = %s AND step_no = %s AND status IN ({', '.join(['%s'] * len(active))}) "
        # A retry of this very attempt (same owner) may take back a lease it could
        # not release, e.g. when the database went away mid-step.
        "AND (lease_until IS NULL OR lease_until < %s OR lease_owner = %s)"
    )
    params = [
        owner,
        now + timedelta(seconds=settings.RUN_LEASE_SECONDS),
        now,
        run_id,
        step_no,
        *active,
        now,
        owner,
    ]
    return statement, params


# The lease need not wait for its own disk flush: the step's commit flushes it (WAL is
# written in order), and if PostgreSQL crashes before that, the lease and the step are
# lost together and the fenced commit refuses.
_RELAXED_COMMIT: tuple[str, list[Any]] = (
    "SELECT set_config('synchronous_commit', 'off', true)",
    [],
)


def _leased_row(statement: str, params: list[Any]) -> tuple[Any, ...] | None:
    """The first row of a lease-taking ``statement``; outside a caller's transaction
    (whose commit must stay synchronous) in a transaction of its own with the relaxed
    commit."""
    if not connection.in_atomic_block:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(*_RELAXED_COMMIT)
            cursor.execute(statement, params)
            return cursor.fetchone()  # type: ignore[no-any-return]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()


def lease_acquire(*, run_id: uuid.UUID | str, step_no: int, owner: str) -> Lease | None:
    """Take the run's lease for ``step_no``; None if the message is stale or the run busy."""
    statement, params = _lease_update(run_id=run_id, step_no=step_no, owner=owner)
    # One statement takes the lease and returns the new fencing token: the step's wake-up
    # latency is mostly round trips to the database.
    row = _leased_row(f"{statement} RETURNING attempt", params)
    if row is None:
        return None
    return Lease(run_id=uuid.UUID(str(run_id)), owner=owner, attempt=row[0], step_no=step_no)


# What a step loads with its lease: the run, its task, and the task's repository and
# workspace (as ``select_related("task__repository", "task__workspace")`` would).
_LOADED: tuple[tuple[type[Any], str], ...] = (
    (Run, "leased"),
    (Task, "t"),
    (Repository, "r"),
    (Workspace, "w"),
)


def lease_acquire_loaded(
    *, run_id: uuid.UUID | str, step_no: int, owner: str
) -> tuple[Lease, Run] | None:
    """Take the lease (as ``lease_acquire``) and load the run with its task, repository and
    workspace; None if the message is stale or the run busy.

    One statement does both: the UPDATE's RETURNING gives the run's row as the lease
    left it, joined to the rows the step reads. A refused lease returns no row and loads
    nothing.
    """
    kept = connection.connection is not None and not connection.in_atomic_block
    try:
        return _lease_acquire_loaded(run_id=run_id, step_no=step_no, owner=owner)
    except (OperationalError, InterfaceError):
        if not kept:
            raise
    # The kept connection died while idle (PostgreSQL restarted, the backend was
    # terminated): worker tasks skip Django's per-task health check (a round trip on
    # every step, see agentplatform.celery), so this first statement is the check. A new
    # connection, then the statement once more: if the first one did take the lease
    # before the connection broke, the same owner takes it again.
    log.info("step.connection_replaced", run_id=str(run_id), step_no=step_no)
    connection.close()
    return _lease_acquire_loaded(run_id=run_id, step_no=step_no, owner=owner)


@functools.cache
def _next_loaded_select() -> str:
    """The load of the next step's rows under a kept lease (``_next_loaded_params``)."""
    table = connection.ops.quote_name(Run._meta.db_table)
    return (
        f"WITH leased AS (SELECT * FROM {table} WHERE id = %s AND lease_owner = %s "  # noqa: S608 - names are ours
        f"AND attempt = %s AND step_no = %s) {_loaded_select()}"
    )


def _next_loaded_params(lease: Lease) -> list[Any]:
    run_id = Run._meta.get_field("id").get_db_prep_value(lease.run_id, connection)
    return [run_id, lease.owner, lease.attempt, lease.step_no + 1]


@functools.cache
def _loaded_select() -> str:
    """The SELECT over the ``leased`` CTE that loads the rows of ``_LOADED`` (built once)."""
    quote = connection.ops.quote_name
    columns = ", ".join(
        f"{alias}.{quote(f.column)}"
        for model, alias in _LOADED
        for f in model._meta.concrete_fields
    )
    return (
        f"SELECT {columns}, EXISTS (SELECT 1 FROM {quote(Approval._meta.db_table)} a "  # noqa: S608 - names are ours
        "WHERE a.run_id = leased.id) OR EXISTS (SELECT 1 FROM "
        f"{quote(InputRequest._meta.db_table)} i WHERE i.run_id = leased.id) FROM leased "
        f"JOIN {quote(Task._meta.db_table)} t ON t.id = leased.task_id "
        f"JOIN {quote(Repository._meta.db_table)} r ON r.id = t.repository_id "
        f"JOIN {quote(Workspace._meta.db_table)} w ON w.id = t.workspace_id"
    )


def _lease_acquire_loaded(
    *, run_id: uuid.UUID | str, step_no: int, owner: str
) -> tuple[Lease, Run] | None:
    statement, params = _lease_update(run_id=run_id, step_no=step_no, owner=owner)
    row = _leased_row(f"WITH leased AS ({statement} RETURNING *) {_loaded_select()}", params)
    if row is None:
        return None
    run = _loaded_instances(row)
    lease = Lease(run_id=run.id, owner=owner, attempt=run.attempt, step_no=step_no)
    return lease, run


def _loaded_instances(row: tuple[Any, ...]) -> Run:
    """The run of a ``_loaded_select`` row, its task, repository and workspace attached."""
    instances = []
    offset = 0
    for model, _alias in _LOADED:
        width = len(model._meta.concrete_fields)
        instances.append(instance_from_row(model, row[offset : offset + width]))
        offset += width
    run, task, repository, workspace = instances
    # The budget's wall clock leaves out time spent waiting for approvals and answers: a
    # run that never waited for a person (most) needs no query for them (runs.agent.budget).
    run.approvals_none = not row[offset]
    Task.repository.field.set_cached_value(task, repository)
    Task.workspace.field.set_cached_value(task, workspace)
    Run.task.field.set_cached_value(run, task)
    return run


def lease_continue_loaded(lease: Lease) -> tuple[Lease, Run] | None:
    """After a commit that kept the lease: the lease of the next step, with the run, its
    task, repository and workspace as they are now (one SELECT, fenced on the lease; None
    if the lease is no longer this worker's)."""
    with connection.cursor() as cursor:
        cursor.execute(_next_loaded_select(), _next_loaded_params(lease))
        row = cursor.fetchone()
    run = None if row is None else _loaded_instances(row)
    if run is None:
        return None
    return Lease(run.id, lease.owner, lease.attempt, lease.step_no + 1), run


def _fenced(lease: Lease) -> Any:
    return Run.objects.filter(pk=lease.run_id, lease_owner=lease.owner, attempt=lease.attempt)


def lease_renew(lease: Lease) -> bool | None:
    """Extend the lease; returns whether cancellation was requested, None if lost."""
    return leases_renew([lease]).get(lease.run_id)


def leases_renew(leases: list[Lease]) -> dict[uuid.UUID, bool]:
    """Extend many leases in one statement: for each lease still held, whether its run's
    cancellation was requested. A lease missing from the answer is no longer held.

    Each row is fenced on (owner, attempt), as every write under a lease. A row locked by
    another transaction (a step's commit) holds the statement up until it commits; a
    lease taken meanwhile fails its fence and is left out of the answer.
    """
    if not leases:
        return {}
    now = timezone.now()
    until = now + timedelta(seconds=settings.RUN_LEASE_SECONDS)
    table = connection.ops.quote_name(Run._meta.db_table)
    statement = (
        f"UPDATE {table} AS r SET lease_until = %s, heartbeat_at = %s "  # noqa: S608 - table name is ours
        "FROM unnest(%s::uuid[], %s::varchar[], %s::integer[]) AS held(id, owner, attempt) "
        "WHERE r.id = held.id AND r.lease_owner = held.owner AND r.attempt = held.attempt "
        "RETURNING r.id, r.cancel_requested_at IS NOT NULL"
    )
    params: list[Any] = [
        until,
        now,
        [lease.run_id for lease in leases],
        [lease.owner for lease in leases],
        [lease.attempt for lease in leases],
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    return {uuid.UUID(str(run_id)): bool(cancelled) for run_id, cancelled in rows}


def lease_release(lease: Lease, *, count_retry: bool = False) -> bool:
    """Give the lease back without a state change (a retry will take it again)."""
    fields: dict[str, Any] = {"lease_owner": "", "lease_until": None}
    if count_retry:
        fields["retries"] = F("retries") + 1
    return _fenced(lease).update(**fields) == 1


class Heartbeat:
    """Renews the lease every third of its length from a thread; sees cancellation.

    The lease is lost when the run's row says so (another worker took it) or when its
    ``lease_until`` passed without a successful renewal and no renewal is under way
    (a dead connection, a database restart, a starved thread): from then on the reaper
    may hand the run to another worker, so this one must stop before its next command
    or model call. A renewal that waits on the run's row lock is not a loss: whoever
    holds that lock also keeps the reaper out.

    The renewals are made by the process's heartbeat thread (``_Beats``), not a thread
    of the step's own: most steps end before their first renewal is due, and starting a
    thread per step cost its start (a scheduling delay under load) on every step.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.cancelled = False
        self._taken = False
        self._expired = False
        self._renewing = False
        self._interval = max(0.5, settings.RUN_LEASE_SECONDS / 3)
        # Monotonic deadline of the lease as last renewed (acquired just before).
        self._valid_until = time.monotonic() + settings.RUN_LEASE_SECONDS
        self.due = time.monotonic() + self._interval
        self.done = False
        # Held while a renewal is under way; the step's end waits for it.
        self._beat_lock = threading.Lock()
        # In the step's context: its log lines carry the run, task and trace ids.
        self._context = contextvars.copy_context()

    @property
    def lost(self) -> bool:
        # Sticky: a renewal that lands after the deadline does not undo the loss, since
        # the reaper may already have handed the run on.
        if not (self._expired or self._renewing) and time.monotonic() >= self._valid_until:
            self._expired = True
        return self._taken or self._expired

    @property
    def renew_from(self) -> float:
        """When (monotonic) this lease is renewed with the others: half an interval before
        it falls due, so the steps of a moment share one statement (``heartbeats_renew``)
        instead of one each."""
        return self.due - self._interval / 2

    def _renewal_begin(self) -> bool:
        """Under ``_beat_lock``: whether to renew now (the step is still on and the lease
        not lost); sets ``done`` when renewing must stop."""
        if self.done:
            return False
        self.due = time.monotonic() + self._interval
        if self.lost:
            self._context.run(log.warning, "heartbeat.lease_expired", run_id=str(self.lease.run_id))
            self.done = True
            return False
        self._renewing = True
        return True

    def _renewal_end(self, state: bool | None) -> None:
        """Under ``_beat_lock``: the renewal came back with ``state`` (``leases_renew``'s
        answer for this lease: None, no longer held)."""
        if state is None:
            self._taken = True
            self.done = True
            return
        self._valid_until = time.monotonic() + settings.RUN_LEASE_SECONDS
        self.cancelled = self.cancelled or state

    def should_stop(self) -> bool:
        return self.cancelled or self.lost

    def __enter__(self) -> Heartbeat:
        _beats.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _beats.remove(self)
        # A renewal under way finishes first; none starts after this.
        with self._beat_lock:
            self.done = True


def heartbeats_renew(heartbeats: list[Heartbeat]) -> None:
    """Renew the leases of ``heartbeats`` with one statement (``leases_renew``).

    A lease left out of the answer was taken by another worker: its step stops. A
    statement that fails (a dead connection, an exhausted pool) renews none of them:
    each lease stays good until its own deadline and becomes uncertain after it, as with
    a renewal of its own. Each heartbeat's lock is held until the answer is applied, so
    a step that ends meanwhile waits for it (and none starts after the step's end).
    """
    renewing: list[Heartbeat] = []
    try:
        for heartbeat in heartbeats:
            heartbeat._beat_lock.acquire()
            if heartbeat._renewal_begin():
                renewing.append(heartbeat)
            else:
                heartbeat._beat_lock.release()
        if not renewing:
            return
        try:
            states = leases_renew([heartbeat.lease for heartbeat in renewing])
        except Exception:
            for heartbeat in renewing:
                heartbeat._context.run(
                    log.warning,
                    "heartbeat.failed",
                    run_id=str(heartbeat.lease.run_id),
                    exc_info=True,
                )
            # The connection may be dead (a terminated backend, a restarted server):
            # close it so the next beat reconnects instead of failing on it until the
            # leases run out.
            with contextlib.suppress(Exception):
                connection.close()
            return
        for heartbeat in renewing:
            heartbeat._renewal_end(states.get(heartbeat.lease.run_id))
    finally:
        for heartbeat in renewing:
            heartbeat._renewing = False
            heartbeat._beat_lock.release()


class _Beats:
    """The process's heartbeat thread: renews the leases of the steps running in it.

    Started by the first step of the process and kept: it sleeps until the earliest
    renewal may be made (or a while when there is none), so a step shorter than a sixth
    of its lease never wakes it. The leases due at one moment are renewed by one statement
    (``heartbeats_renew``): a threads pool runs hundreds of steps in one process. Its
    database connection is closed whenever no step is left to renew, as a thread per
    step closed its own.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also in a forked child: the parent's thread and a lock it held are not there.
        self._lock = threading.Lock()
        self._beating: set[Heartbeat] = set()
        self._wake = threading.Event()
        self._wake_at = 0.0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beating.add(heartbeat)
            alive = self._thread is not None and self._thread.is_alive()
            if not alive or self._pid != os.getpid():
                # A new process (a fork of the pool) has no heartbeat thread yet.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="run-heartbeat", daemon=True)
                self._thread.start()
            elif heartbeat.renew_from < self._wake_at:
                self._wake.set()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beating.discard(heartbeat)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [h for h in self._beating if h.renew_from <= now]
                later = [h.renew_from for h in self._beating if h.renew_from > now]
                idle = now + max(0.25, settings.RUN_LEASE_SECONDS / 6)
                self._wake_at = min([*later, idle])
                self._wake.clear()
            try:
                heartbeats_renew(due)
            except Exception:  # never let one beat end the thread
                log.exception("heartbeat.crashed", runs=len(due))
            for heartbeat in due:
                if heartbeat.done:
                    self.remove(heartbeat)
            with self._lock:
                idle_now = not self._beating
            if idle_now and connection.connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            self._wake.wait(max(0.0, self._wake_at - time.monotonic()))


_beats = _Beats()
os.register_at_fork(after_in_child=_beats._reset)


class StepContext:
    """What a step handler works with: the run, its task, buffered events, durability."""

    def __init__(self, run: Run, lease: Lease) -> None:
        self.run = run
        self.task = run.task
        self.repository = run.task.repository
        self.lease = lease
        self.events: list[PendingEvent] = []
        self.checkpoint: dict[str, Any] = dict(run.checkpoint or {})
        self.heartbeat: Heartbeat | None = None
        # Callables run inside the commit transaction (rows that belong to the step).
        self._commit_writes: list[Callable[[], None]] = []
        self._after_commit: list[Callable[[], None]] = []
        # Until when (monotonic) a commit may keep the lease for the next step, and
        # whether the commit did (see step_execute).
        self.slice_end = float("-inf")
        self.lease_kept = False
        # The next step's lease and rows, when the commit that kept the lease loaded them.
        self.next_loaded: tuple[Lease, Run] | None = None

    @property
    def step_no(self) -> int:
        return self.lease.step_no

    def emit(self, type: str, data: dict[str, Any] | None = None, actor: str = "") -> None:
        self.events.append(PendingEvent(type=type, data=data or {}, actor=actor))

    def write_on_commit(self, write: Callable[[], None]) -> None:
        self._commit_writes.append(write)

    def after_commit(self, action: Callable[[], None]) -> None:
        self._after_commit.append(action)

    def should_stop(self) -> bool:
        return self.heartbeat.should_stop() if self.heartbeat else False

    def check_cancelled(self) -> None:
        """Raise RunCancelled if cancellation was requested; call before costly actions."""
        if self.heartbeat and self.heartbeat.lost:
            raise LeaseLost(f"lease on run {self.run.id} lost")
        if (self.heartbeat and self.heartbeat.cancelled) or Run.objects.filter(
            pk=self.run.id, cancel_requested_at__isnull=False
        ).exists():
            raise RunCancelled()

    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """A transaction for a mid-step checkpoint (e.g. an answered model turn).

        Commits only while the lease is ours; buffered events are flushed with it so the
        timeline never shows a fact whose rows were rolled back.
        """
        with transaction.atomic():
            if _fenced(self.lease).update(heartbeat_at=timezone.now()) != 1:
                raise LeaseLost(f"lease on run {self.run.id} lost")
            yield
            if self.events:
                events_record(task=self.task, run=self.run, events=self.events)
                self.events = []


Handler = Callable[[StepContext], Outcome]


def _handlers() -> dict[str, Handler]:
    from runs import steps

    return steps.HANDLERS


def budget_check(ctx: StepContext) -> None:
    """Fail (or time out) the run when its task's cumulative wall-clock or cost is spent.

    Not in running, which checks before every model call and submits the working copy
    when these run out, and not for a patch submitted that way: verifying and judging
    it is what the submission is for.
    """
    from runs.agent.budget import budget_enforce

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
            handler = _handlers()[run.status]
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
            _task_status_follow(ctx.task, source=source, target=target)
        if target is not None:
            run.status = target
            if target in TERMINAL:
                closing, after = _terminal_events(ctx, target, outcome)
                events.extend(closing)
        next_step = lease.step_no + 1
        # The next step's wake-up is the first thing sent on commit (before the relay's
        # and the live views' wake-ups): it is what the run waits for.
        # (With the lease kept, this worker takes the next step itself.)
        if not keep and status in STEPPABLE and not outcome.wait:
            dispatch.run_wake_on_commit(run_id=run.id, step_no=next_step, status=status)
        events_record(task=ctx.task, run=run, events=events, reserved=(last, reserved))
        if target in TERMINAL:
            transaction.on_commit(lambda: _after_terminal(run.id, after))
        for action in ctx._after_commit:
            transaction.on_commit(action)


def _fenced_update(lease: Lease, source: str, fields: dict[str, Any]) -> int | None:
    """The step's fenced UPDATE of its run; the run's ``last_sequence_no`` after it, or
    None when the lease is no longer this worker's (nothing was written). Inside the
    commit's transaction: the row stays locked between the two statements."""
    fenced = _fenced(lease).filter(status=source, step_no=lease.step_no)
    if fenced.update(**fields) != 1:
        return None
    return int(Run.objects.filter(pk=lease.run_id).values_list("last_sequence_no", flat=True)[0])


def _terminal_events(
    ctx: StepContext, target: str, outcome: Outcome
) -> tuple[list[PendingEvent], int | None]:
    """The run's and the task's closing facts, and the task's status, in the same commit;
    with the id of the after-terminal work item recorded with them (None: no such work).

    Pending approvals of the run are voided here, so nobody can approve (or expire)
    a patch of a run that is over.
    """
    from runs.services import approvals_void

    task = ctx.task
    run = ctx.run
    approvals_void(run_id=run.pk)
    delivered = target != S.COMPLETED and _delivered_before(task, run)
    closing, task_fields = _terminal_closing(ctx, target, outcome, delivered_before=delivered)
    Task.objects.filter(pk=task.pk).update(**task_fields)
    # After the task's row is written: the item's condition reads that row.
    with connection.cursor() as cursor:
        cursor.execute(*_after_terminal_insert_sql(task, run))
        row = cursor.fetchone()
    return closing, None if row is None else int(row[0])


def _after_terminal_insert_sql(task: Task, run: Run) -> tuple[str, list[Any]]:
    """The after-terminal work item of a run's end, recorded only when there is such work
    (``after_terminal_needed_sql``: batched feedback, a deferred task), returning its id.

    Batched feedback and deferred tasks wait for this: a row, not a callback, so a crash
    or a refused broker right after the commit cannot strand them. No wake-up: the
    committing worker runs the item right after the commit (``_after_terminal``), and a
    message would only be a second, idle claim of it, one per run, queued behind every
    other wake-up of the events queue. If that worker dies first, the work sweep wakes
    the item; deferred tasks are also re-admitted by their own schedule. A run ends once
    (its end is fenced in its transaction): its item is new.
    """
    from jobs.work import work_insert_when
    from runs.services import after_terminal_needed_sql

    return work_insert_when(
        kind=AFTER_TERMINAL,
        key=str(run.pk),
        args={"run_id": str(run.pk)},
        when=after_terminal_needed_sql(task=task),
    )


def _terminal_closing(
    ctx: StepContext, target: str, outcome: Outcome, *, delivered_before: bool
) -> tuple[list[PendingEvent], dict[str, Any]]:
    """The closing events of a run ending in ``target`` and the task's fields after it.

    ``delivered_before``: an earlier run of the task completed and its pull request is
    still open (``_delivered_before``).
    """
    from runs.agent.budget import run_working_seconds

    task, run = ctx.task, ctx.run
    data: dict[str, Any] = {"run_no": run.run_no}
    if target != S.COMPLETED:
        data.update(reason=outcome.reason or target, detail=outcome.detail[:500])
    usage = dict(task.usage or {})
    usage["wall_clock_seconds"] = float(usage.get("wall_clock_seconds", 0)) + (
        run_working_seconds(run)
    )
    if delivered_before:
        # A retry of a task that already delivered: its failure ends this run, not the
        # task, whose pull request is still open and still what it delivered.
        return [PendingEvent(TERMINAL_RUN_EVENT[target], data)], {
            "status": Task.Status.COMPLETED,
            "status_reason": f"run {run.run_no} {target}: {outcome.reason or target}",
            "usage": usage,
            "updated_at": timezone.now(),
        }
    return [
        PendingEvent(TERMINAL_RUN_EVENT[target], data),
        PendingEvent(TERMINAL_TASK_EVENT[target], data),
    ], {
        "status": TERMINAL_TASK_STATUS[target],
        "status_reason": outcome.reason if target != S.COMPLETED else "",
        "usage": usage,
        "updated_at": timezone.now(),
    }


def _delivered_before(task: Task, run: Run) -> bool:
    """Whether an earlier run of the task completed and its pull request is still open."""
    return (
        Run.objects.filter(task=task, status=S.COMPLETED, run_no__lt=run.run_no).exists()
        and PullRequest.objects.filter(task=task, state=PullRequest.State.OPEN).exists()
    )


def _task_status_followed(*, source: str, target: str | None) -> str | None:
    """The task's status when a step of its run moves from ``source`` to ``target``
    (None: the task's status stays): it says when it waits for a person, and when it
    runs again."""
    if target is None or target in TERMINAL:
        return None
    if target == S.AWAITING_APPROVAL:
        return str(Task.Status.AWAITING_APPROVAL)
    if target == S.AWAITING_INPUT:
        return str(Task.Status.AWAITING_INPUT)
    if source in (S.AWAITING_APPROVAL, S.AWAITING_INPUT, S.QUEUED):
        return str(Task.Status.RUNNING)
    return None


def _task_status_follow(task: Task, *, source: str, target: str) -> None:
    status = _task_status_followed(source=source, target=target)
    if status is not None:
        Task.objects.filter(pk=task.pk).exclude(status=status).update(
            status=status, updated_at=timezone.now()
        )


AFTER_TERMINAL = "run.after_terminal"


def _after_terminal(run_id: uuid.UUID, item_id: int | None) -> None:
    """Clean the sandbox, then run the after-terminal work item now, if the run's end
    recorded one (it was recorded without a wake-up). If running it here raised (the
    database went away meanwhile),
    its wake-up is sent, so a worker retries it at once rather than the work sweep
    ``WORK_REWAKE_SECONDS`` later; a failure of the item's own handler is retried by
    the item's backoff."""
    from jobs.work import work_wake_key
    from jobs.work_execution import work_execute
    from runs.agent.sandbox import run_workdirs_remove

    try:
        run_workdirs_remove(run_id)
    except Exception:
        log.exception("run.workdirs_remove_failed", run_id=str(run_id))
    if item_id is None:
        return
    try:
        work_execute(item_id=item_id)
    except Exception:
        log.exception("run.after_terminal_failed", run_id=str(run_id))
        try:
            work_wake_key(kind=AFTER_TERMINAL, key=str(run_id))
        except Exception:
            log.warning("run.after_terminal_wake_failed", run_id=str(run_id), exc_info=True)


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


def run_end_unleased(
    *,
    run_id: uuid.UUID | str,
    target: str,
    reason: str,
    detail: str = "",
    events: list[PendingEvent] | None = None,
) -> bool:
    """End a run that no worker holds (reaper, cancelling an idle run). False if raced."""
    now = timezone.now()
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .select_related("task__repository", "task__workspace")
            .filter(pk=run_id)
            .first()
        )
        if run is None or run.status in TERMINAL:
            return False
        if run.lease_until is not None and run.lease_until >= now:
            return False
        transition_check(run.status, target)
        source = run.status
        Run.objects.filter(pk=run.pk).update(
            status=target,
            status_changed_at=now,
            finished_at=now,
            lease_owner="",
            lease_until=None,
            step_no=F("step_no") + 1,
            failure_reason=reason if target != S.COMPLETED else "",
            failure_detail=detail[:5000],
        )
        ctx = StepContext(run, Lease(run.id, "", run.attempt, run.step_no))
        pending = list(events or [])
        pending.append(
            PendingEvent(
                "agent.run.status.changed", {"from": source, "to": target, "reason": reason}
            )
        )
        closing, after = _terminal_events(
            ctx, target, Outcome(to=target, reason=reason, detail=detail)
        )
        pending.extend(closing)
        events_record(task=run.task, run=run, events=pending)
        transaction.on_commit(lambda: _after_terminal(run.id, after))
    return True
