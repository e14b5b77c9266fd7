"""Model instances from raw rows of a hand-written statement, as the ORM builds them, and
model instances as JSON rows for a hand-written INSERT.

Hot paths (a step's lease, a request's token and repository) read their rows with one
fixed statement instead of compiling a queryset each time; the rows still become model
instances through each field's database converters (JSON decoded, and so on).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models.sql import UpdateQuery


@contextlib.contextmanager
def cursor_prepared() -> Iterator[Any]:
    """A cursor for one of the fixed statements hot paths send, whose plan PostgreSQL
    keeps: each statement is prepared on the connection the first time it is sent and
    executed by name from then on.

    Django binds parameters client-side, so PostgreSQL parses and plans every statement
    it receives; for the one-row lookups every request or step makes, planning took
    three to five times as long as the execution. Only for a single statement with
    ``%s`` (or ``%(name)s``) parameters and a fixed text (the prepared statements a
    connection keeps are looked up by text); it goes through Django's cursor wrapper
    (error translation) as any other. ``DATABASE_PREPARED_STATEMENTS=0`` turns it off, for a
    connection pooler that does not keep prepared statements across transactions.
    """
    connection = _connection()
    if not _preparing():
        with connection.cursor() as cursor:
            yield cursor
        return
    raw = _preparing_connection()
    with connection.make_cursor(_preparing_cursor_class()(raw)) as cursor:
        yield cursor


def execute_together(parts: Sequence[tuple[str, Sequence[Any]]]) -> tuple[Any, ...] | None:
    """Run ``parts`` (statement, parameters) in one round trip (PostgreSQL), one after the
    other, each with a snapshot of its own; the first row of the last statement's result,
    if it returns rows.

    Outside a transaction block they are one transaction; inside one (``atomic()``),
    part of it. With prepared statements on (see ``cursor_prepared``), the statements go
    in one pipeline, each prepared on the connection the first time its text is sent:
    the batch up to its Sync is one implicit transaction, and PostgreSQL plans none of
    them again. Otherwise they go as one query string, which PostgreSQL also runs as one
    transaction. Either way an error in any of them rolls back all of them (or fails the
    transaction around them) and arrives as Django's.

    When the batch is the first thing an ``atomic()`` block sends, its BEGIN goes in the
    same pipeline (see ``_begins_here``).
    """
    connection = _connection()
    if not _preparing():
        with connection.cursor() as cursor:
            cursor.execute("; ".join(text for text, _ in parts), [p for _, ps in parts for p in ps])
            for _ in parts[1:]:
                cursor.nextset()
            return cursor.fetchone() if _returns_rows(cursor.cursor) else None
    raw = _preparing_connection()
    begin = _begins_here(connection, raw)
    with (
        connection.wrap_database_errors,
        connection.make_cursor(_preparing_cursor_class()(raw)) as cursor,
    ):
        # Leaving the pipeline sends its one Sync and reads every result; the errors of
        # the batch are raised there. (An explicit sync() before leaving would cost a
        # second round trip: the exit sends a Sync of its own.)
        with raw.pipeline():
            if begin:
                cursor.cursor.execute("BEGIN", prepare=False)
            for text, params in parts:
                cursor.execute(text, params)
        return cursor.fetchone() if _returns_rows(cursor.cursor) else None


def fetchone_prepared(
    text: str, params: Sequence[Any], *, generic_plan: bool = False
) -> tuple[Any, ...] | None:
    """The first row of ``text``, a fixed statement sent as ``cursor_prepared`` sends it;
    with ``generic_plan``, run on its generic plan: for a statement whose best plan is
    the same whatever its parameters.

    PostgreSQL plans a prepared statement for its values five times, then keeps its
    generic plan only if that one's estimate is no dearer. The generic plan estimates a
    ``LIMIT $n`` at a tenth of the rows and a column by its average value, so a list's
    page looked several times dearer than the plan made for its values, and PostgreSQL
    planned it anew on every request (a third of the list's database time over 100,000
    runs) although both plans were the same. ``plan_cache_mode`` is set for the
    statement's transaction only, in the same round trip: the round trip's own outside
    ``atomic()``, else the block's.
    """
    if generic_plan and _preparing():
        return execute_together([(_GENERIC_PLAN, ()), (text, params)])
    with cursor_prepared() as cursor:
        cursor.execute(text, params)
        return cursor.fetchone()  # type: ignore[no-any-return]


_GENERIC_PLAN = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


def _begins_here(connection: Any, raw: Any) -> bool:
    """Whether the batch should open the ``atomic()`` block's transaction itself, and the
    connection is set for it.

    psycopg opens a transaction with a BEGIN of its own, waited for alone (a round trip,
    even in a pipeline), before the block's first statement. When that statement is this
    batch, the BEGIN goes in front of it instead: psycopg is put in autocommit (allowed
    while no transaction is open; it then sends no BEGIN) and the batch's own BEGIN opens
    the block's transaction on the server. Everything else is unchanged: psycopg commits
    or rolls back by the server's transaction status, whatever its autocommit, and
    Django turns autocommit back on when the block ends. Not for a connection with its
    own isolation level or access mode, whose BEGIN says more.
    """
    from psycopg.pq import TransactionStatus

    if not (
        connection.in_atomic_block
        and not raw.autocommit
        and raw.pgconn.transaction_status == TransactionStatus.IDLE
        and raw.isolation_level is None
        and raw.read_only is None
        and raw.deferrable is None
    ):
        return False
    raw.autocommit = True
    return True


def execute_committing(text: str, params: Any) -> None:
    """Run ``text``, the last statement of the transaction, and commit in the same round
    trip, when the transaction is the outermost ``atomic()`` block's (the one that commits).

    The statement and a COMMIT go in one pipeline. When the block ends, Django's commit
    finds the transaction already committed and sends nothing, and the block's
    ``on_commit`` callbacks run as usual; an error in either statement arrives as Django's
    and the block rolls back as usual. Nothing may use the connection between this call
    and the end of the block: it would run in a transaction of its own. In a nested block
    (a savepoint, or a caller's transaction around this one), or with prepared statements
    off, the statement runs alone and the block commits as it always does.
    """
    connection = _connection()
    if not (_preparing() and _commits_on_exit()):
        with cursor_prepared() as cursor:
            cursor.execute(text, params)
        return
    raw = _preparing_connection()
    with (
        connection.wrap_database_errors,
        connection.make_cursor(_preparing_cursor_class()(raw)) as cursor,
        raw.pipeline(),
    ):
        cursor.execute(text, params)
        # Queued behind it (the connection's commit() would sync at once), and sent
        # unprepared: a transaction's end is no statement to keep a plan of.
        cursor.cursor.execute("COMMIT", prepare=False)


def _commits_on_exit() -> bool:
    """Whether the current transaction is the outermost atomic block's, to be committed
    when it ends (no savepoint, no caller's transaction, not marked for rollback)."""
    connection = _connection()
    return (
        connection.in_atomic_block
        and len(connection.atomic_blocks) == 1
        and connection.commit_on_exit
        and not connection.needs_rollback
        and not connection.savepoint_ids
    )


def _returns_rows(cursor: Any) -> bool:
    """Whether the psycopg cursor's current result has rows to fetch. (Its
    ``description`` says so too, but builds a column object for each of the result's
    columns: a tenth of a millisecond for the next step's load.)"""
    from psycopg.pq import ExecStatus

    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def update_sql(queryset: Any, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """``queryset.update(**values)`` as (statement, parameters), compiled by the ORM as
    ``update()`` compiles it, for a batch (``execute_together``)."""
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    sql, params = query.get_compiler(connection=connection).as_sql()
    return sql, list(params)


def _preparing() -> bool:
    connection = _connection()
    # Django's query log (DEBUG, a test's query capture) reads the statement's text,
    # which a statement executed by name does not carry: sent as text there.
    return settings.DATABASE_PREPARED_STATEMENTS and not connection.queries_logged


def _preparing_connection() -> Any:
    """The psycopg connection under Django's, set to prepare only what asks for it."""
    connection = _connection()
    connection.validate_thread_sharing()
    connection.ensure_connection()
    psycopg_connection = connection.connection
    if psycopg_connection.prepare_threshold is None:
        # Django turns psycopg's preparing off; only these cursors ask for it (and
        # psycopg's client-binding cursors, Django's own, never prepare).
        psycopg_connection.prepare_threshold = _PREPARE_ONLY_WHEN_ASKED
    return psycopg_connection


def _preparing_cursor_class() -> type[Any]:
    global _PREPARING_CURSOR
    if _PREPARING_CURSOR is None:
        from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
            ServerBindingCursor,
        )

        class PreparingCursor(ServerBindingCursor):  # type: ignore[misc,valid-type]
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                kwargs.setdefault("prepare", True)
                return super().execute(query, params, **kwargs)

        _PREPARING_CURSOR = PreparingCursor
    return _PREPARING_CURSOR


_PREPARING_CURSOR: type[Any] | None = None


def _connection() -> Any:
    """The default connection itself: each attribute read through ``django.db.connection``
    looks the connection up again (a thread-local read), dozens of times a request."""
    return connections[DEFAULT_DB_ALIAS]


# A count of executions no statement reaches: psycopg prepares only what asks for it.
_PREPARE_ONLY_WHEN_ASKED = 2**31 - 1

# (index in the row, column expression, the field's database converters).
Converting = list[tuple[int, Any, list[Any]]]

# Per model: the fields' attribute names and, for each field that has any,
# its database converters. Asking every field for its converters on every step cost more
# worker CPU than the lease's round trip.
_ROW_READERS: dict[type[Any], tuple[list[str], Converting]] = {}


def converters_of(model: type[Any], fields: Any) -> Converting:
    """(index, column, converters) for each of ``fields`` (of ``model``, in row order)
    that has database converters."""
    converting = []
    for index, f in enumerate(fields):
        # The backend's converters take a column expression, as the ORM gives them.
        column = f.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(column) + f.get_db_converters(connection)
        if converters:
            converting.append((index, column, converters))
    return converting


def row_convert(values: Any, converting: Converting) -> list[Any]:
    """A raw row's values as the ORM reads them: each through its field's converters."""
    connection = _connection()
    converted = list(values)
    for index, column, converters in converting:
        value = converted[index]
        for convert in converters:
            value = convert(value, column, connection)
        converted[index] = value
    return converted


def _row_reader(model: type[Any]) -> tuple[list[str], Converting]:
    reader = _ROW_READERS.get(model)
    if reader is None:
        fields = model._meta.concrete_fields
        reader = ([f.attname for f in fields], converters_of(model, fields))
        _ROW_READERS[model] = reader
    return reader


def instance_from_row(model: type[Any], values: Any) -> Any:
    """A model instance from raw column values, through the fields' database converters."""
    connection = _connection()
    attnames, converting = _row_reader(model)
    if len(values) != len(attnames):
        raise ValueError(f"{len(values)} values for {len(attnames)} columns of {model.__name__}")
    return model.from_db(connection.alias, attnames, row_convert(values, converting))


# Per model: its concrete fields, in the constructor's positional order.
_NEW_FIELDS: dict[type[Any], list[tuple[str, Any]]] = {}


def instance_new(model: type[Any], related: dict[str, Any] | None = None, **values: Any) -> Any:
    """A new, unsaved instance, as ``model(**values)`` builds it: every field not given
    holds its default, and each instance in ``related`` (by relation name) is cached on
    it, its key set. ``values`` are by attname (``workspace_id``, not ``workspace``).

    The constructor's positional form, which ``from_db`` uses too: the keyword form
    looks every field up by name, and cost four times as much for a run's 33 fields.
    """
    fields = _NEW_FIELDS.get(model)
    if fields is None:
        fields = _NEW_FIELDS[model] = [(f.attname, f) for f in model._meta.concrete_fields]
    relations = [(model._meta.get_field(name), obj) for name, obj in (related or {}).items()]
    for relation, obj in relations:
        values[relation.attname] = obj.pk
    args = [
        values.pop(attname) if attname in values else field.get_default()
        for attname, field in fields
    ]
    if values:
        raise TypeError(f"{model.__name__}: no concrete fields {sorted(values)}")
    instance = model(*args)
    for relation, obj in relations:
        relation.set_cached_value(instance, obj)
    return instance


# Per model: how each concrete field's value goes into a JSON row (see ``row_json``).
_JSON_WRITERS: dict[type[Any], list[tuple[str, str, str]]] = {}


def _json_writer(model: type[Any]) -> list[tuple[str, str, str]]:
    writer = _JSON_WRITERS.get(model)
    if writer is None:
        writer = []
        for f in model._meta.concrete_fields:
            target = f.target_field if f.is_relation else f
            if isinstance(target, models.DateTimeField):
                stamped = not f.is_relation and (f.auto_now or f.auto_now_add)
                kind = "now" if stamped else "datetime"
            elif isinstance(target, models.UUIDField | models.DecimalField):
                kind = "str"
            elif isinstance(
                target,
                models.JSONField
                | models.CharField
                | models.TextField
                | models.IntegerField
                | models.BooleanField,
            ):
                kind = "value"  # JSON holds these as they are
            else:
                raise TypeError(f"{model.__name__}.{f.name}: no JSON form for this field")
            writer.append((f.attname, f.column, kind))
        _JSON_WRITERS[model] = writer
    return writer


def row_json(instance: Any, now: datetime) -> dict[str, Any]:
    """Every column of ``instance`` as a JSON object for ``jsonb_populate_record``.

    Values are what the instance holds (its defaults applied by the constructor);
    ``auto_now``/``auto_now_add`` fields take ``now`` and the instance is given it, as
    saving would. JSON fields go in as JSON, so PostgreSQL stores what the ORM would.
    """
    row: dict[str, Any] = {}
    for attname, column, kind in _json_writer(type(instance)):
        value = getattr(instance, attname)
        if kind == "now":
            value = now
            setattr(instance, attname, now)
        if value is not None and kind in ("now", "datetime"):
            value = value.isoformat()
        elif value is not None and kind == "str":
            value = str(value)
        row[column] = value
    return row
