"""The statements of ``jobs`` that the ORM cannot express, each named, with its reason.

Everything else in ``jobs`` goes through the ORM. What stays here: claims that lock
with ``SKIP LOCKED`` inside a subquery and return the claimed rows in the same statement
(``UPDATE ... RETURNING``, ``FOR UPDATE OF`` a CTE), a conditional ``INSERT ... SELECT``,
and ``ANALYZE``. Statements that return one model's rows run through
``Model.objects.raw``, which builds the instances as the ORM does.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models.sql import InsertQuery

from jobs.models import OutboxEvent, ProcessedEvent, WorkItem

# --- work items ---------------------------------------------------------------------------

# A drain's claim: the oldest due item of the queue that no one holds, leased in the same
# statement, its previous unfinished claim counted as a crash. SQL because the ORM has no
# UPDATE over a ``FOR UPDATE SKIP LOCKED`` subquery that returns the updated row: two
# drains of one queue must never wait for, or take, the same item. An item that would
# turn poison is left to the single-item claim (``jobs.work._claim``), which
# dead-letters it under its row lock. Parameters: lease end, claim token, queue, now,
# now, poison threshold.
WORK_CLAIM_NEXT = f"""
UPDATE {WorkItem._meta.db_table}
SET lease_until = %s, claim = %s,
    crashes = crashes + (CASE WHEN lease_until IS NULL THEN 0 ELSE 1 END),
    attempts = attempts + 1, wakes = 0
WHERE id = (
    SELECT id FROM {WorkItem._meta.db_table}
    WHERE status = 'pending' AND queue = %s AND due_at <= %s
      AND (lease_until IS NULL OR lease_until <= %s)
      AND crashes + (CASE WHEN lease_until IS NULL THEN 0 ELSE 1 END) < %s
    ORDER BY due_at LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING *
"""  # noqa: S608 - the table name is ours


def work_insert_when(item: WorkItem, condition: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """The INSERT of ``item`` as (statement, parameters), made only if ``condition``
    (SQL, parameters) holds when the statement runs, returning the new id (no row when
    it does not hold).

    SQL because the ORM has no conditional INSERT (``INSERT ... SELECT ... WHERE``):
    deciding first and inserting after would let the condition change in between. The
    column list and values are the ORM's own, compiled for ``item``.
    """
    meta = WorkItem._meta
    query = InsertQuery(WorkItem)
    query.insert_values([f for f in meta.concrete_fields if f is not meta.pk], [item])
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = [meta.pk]
    ((sql, params),) = compiler.as_sql()
    # INSERT INTO t (columns) VALUES (values) RETURNING t.id
    # -> INSERT INTO t (columns) SELECT values WHERE condition RETURNING t.id
    head, values_returning = sql.split(" VALUES (", 1)
    values, returning = values_returning.rsplit(") RETURNING ", 1)
    where, where_params = condition
    return (
        f"{head} SELECT {values} WHERE {where} RETURNING {returning}",
        [*params, *where_params],
    )


# --- the outbox ---------------------------------------------------------------------------

# A relay batch's claim: the heads of up to ``partitions`` partitions (a pending row with
# no earlier pending row in its partition) that no other relay holds, then those
# partitions' pending rows in id order up to ``limit``. SQL because the ORM cannot lock
# the heads with ``SKIP LOCKED`` inside a CTE and then lock their partitions' rows in the
# same statement; the heads are ours, so the second lock never waits. Parameters: now,
# partitions, limit.
OUTBOX_BATCH_CLAIM = f"""
WITH heads AS MATERIALIZED (
    SELECT o.partition_key FROM {OutboxEvent._meta.db_table} o
    WHERE o.published_at IS NULL AND o.available_at <= %s
      AND NOT EXISTS (
          SELECT 1 FROM {OutboxEvent._meta.db_table} e
          WHERE e.partition_key = o.partition_key AND e.published_at IS NULL AND e.id < o.id
      )
    ORDER BY o.id LIMIT %s
    FOR UPDATE OF o SKIP LOCKED
)
SELECT c.* FROM {OutboxEvent._meta.db_table} c
WHERE c.partition_key IN (SELECT partition_key FROM heads) AND c.published_at IS NULL
ORDER BY c.id LIMIT %s
FOR UPDATE OF c
"""  # noqa: S608 - the table name is ours

# The columns the claim's filters read, for ``outbox_analyze``.
_OUTBOX_FILTERED = ("published_at", "available_at", "partition_key")


def outbox_analyze() -> None:
    """Refresh PostgreSQL's statistics of the outbox's filtered columns (``ANALYZE``, a
    maintenance command the ORM does not have); 0.2 s with 1,360,000 rows, against 0.6 s
    for the whole table, whose payloads the sample would read too."""
    quote = connection.ops.quote_name
    columns = {f.name: f.column for f in OutboxEvent._meta.concrete_fields}
    listed = ", ".join(quote(columns[name]) for name in _OUTBOX_FILTERED)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {quote(OutboxEvent._meta.db_table)} ({listed})")


# --- locks and receipts -------------------------------------------------------------------


def advisory_xact_lock_try(key: int) -> bool:
    """Whether this transaction now holds PostgreSQL's advisory lock ``key`` (held until
    it ends, and dropped when its connection dies). SQL because advisory locks are
    functions the ORM has no query for."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [key])
        return bool(cursor.fetchone()[0])


# A consumer's receipt for an event, inserted unless it exists, returning a row only when
# inserted. SQL because the ORM has no ``INSERT ... ON CONFLICT DO NOTHING`` that says
# whether it inserted (``bulk_create(ignore_conflicts=True)`` does not), and a savepoint
# around ``create`` would cost two more round trips on every consumed event. A
# concurrent duplicate waits on the unique index until the first commits, then inserts
# nothing. Parameters: consumer, event id.
PROCESSED_EVENT_INSERT = f"""
INSERT INTO {ProcessedEvent._meta.db_table} (consumer, event_id, processed_at)
VALUES (%s, %s, CURRENT_TIMESTAMP)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING id
"""  # noqa: S608 - the table name is ours
