"""Run leases (docs/design.md §7): who may take a run's step, fenced by ``attempt``.

A worker takes a run's lease with a conditional UPDATE that also bumps the fencing token
(``attempt``); a message whose step already happened, or whose run is leased by someone
else, takes nothing. Every write of a step is fenced on (owner, attempt): a worker that
lost its lease writes nothing.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from jobs.db_rows import instance_from_row
from runs.logs import log
from runs.models import Approval, InputRequest, Repository, Run, Task, Workspace
from runs.state import ACTIVE


class LeaseLost(Exception):
    """Another worker (or the reaper) owns the run now; this worker must write nothing."""


@dataclass(frozen=True)
class Lease:
    run_id: uuid.UUID
    owner: str
    attempt: int
    step_no: int


def worker_identity() -> str:
    """A lease owner: ``<hostname>:<pid>:<nonce>``."""
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


def lease_fenced(lease: Lease) -> QuerySet[Run]:
    """The run's row, as long as ``lease`` is still its lease."""
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
    return lease_fenced(lease).update(**fields) == 1
