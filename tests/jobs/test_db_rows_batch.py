"""A batch of statements (``execute_together``) is one round trip to PostgreSQL: the
protocol's own trace (libpq's, as psycopg exposes it) shows what goes over the wire."""

from __future__ import annotations

import tempfile

import pytest
from django.db import IntegrityError, connection, transaction

from jobs.db_rows import execute_committing, execute_together

pytestmark = pytest.mark.django_db(transaction=True)


def _traced(call):
    """Run ``call``; its result and the protocol messages sent (F) and received (B)."""
    from psycopg.pq import Trace

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            result = call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = [line.split("\t") for line in trace.read().splitlines()]
    return result, [(line[0], line[2].split(" ")[0]) for line in lines if len(line) > 2]


def test_a_prepared_batch_sends_one_sync_and_waits_for_one_answer(settings) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    parts = [("SELECT set_config('application_name', %s, true)", ["batch"]), ("SELECT %s", [7])]
    execute_together(parts)  # prepared here; the second time runs them by name
    row, messages = _traced(lambda: execute_together(parts))
    assert row == (7,)
    assert messages.count(("F", "Sync")) == 1
    assert messages.count(("B", "ReadyForQuery")) == 1
    assert ("F", "Parse") not in messages


def test_an_error_in_a_prepared_batch_still_arrives_as_djangos(settings) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE batch_probe (id int PRIMARY KEY)")
    parts = [
        ("INSERT INTO batch_probe (id) VALUES (%s)", [1]),
        ("INSERT INTO batch_probe (id) VALUES (%s)", [1]),
    ]

    def duplicate() -> None:
        with pytest.raises(IntegrityError):
            execute_together(parts)

    _, messages = _traced(duplicate)
    assert messages.count(("F", "Sync")) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM batch_probe")
        assert cursor.fetchone() == (0,)  # the first INSERT went with the second
        cursor.execute("SELECT 1")  # the connection is usable after the error


@pytest.mark.parametrize("prepared", [True, False], ids=["pipeline", "query-string"])
def test_a_batch_answers_without_describing_its_columns(settings, monkeypatch, prepared) -> None:
    """The next step's load has about a hundred columns: describing them (one object per
    column) cost more than reading the row."""
    import psycopg

    settings.DATABASE_PREPARED_STATEMENTS = prepared
    described: list[int] = []
    real = psycopg.Cursor.description

    def counting(cursor):
        described.append(1)
        return real.fget(cursor)

    monkeypatch.setattr(psycopg.Cursor, "description", property(counting))
    assert execute_together([("SELECT 1", []), ("SELECT %s, %s", [2, 3])]) == (2, 3)
    assert execute_together([("SELECT 1", []), ("SET LOCAL work_mem = '8MB'", [])]) is None
    assert described == []


# --- the transaction's last statement with its COMMIT -------------------------------------


@pytest.fixture
def probe():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS commit_probe (id int PRIMARY KEY)")
        cursor.execute("TRUNCATE commit_probe")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS commit_probe")


def _probe_ids() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM commit_probe ORDER BY id")
        return [i for (i,) in cursor.fetchall()]


def test_the_last_statement_and_the_commit_are_one_round_trip(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    committed: list[int] = []

    def block() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # the transaction is open
            transaction.on_commit(lambda: committed.append(1))
            execute_committing("INSERT INTO commit_probe (id) VALUES (%s)", [1])

    _, messages = _traced(block)
    # BEGIN and the SELECT, then one batch; Django's commit at the block's end sends nothing.
    assert messages.count(("B", "ReadyForQuery")) == 3, messages
    assert messages.count(("F", "Sync")) == 1
    assert messages[-1] == ("B", "ReadyForQuery")
    assert committed == [1]  # the callbacks ran once, after the commit
    assert _probe_ids() == [1]
    assert connection.get_autocommit()


def test_in_a_callers_transaction_the_statement_waits_for_its_commit(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    with pytest.raises(RuntimeError), transaction.atomic():
        with transaction.atomic():
            execute_committing("INSERT INTO commit_probe (id) VALUES (%s)", [1])
        with transaction.atomic(savepoint=False):
            execute_committing("INSERT INTO commit_probe (id) VALUES (%s)", [2])
        raise RuntimeError("the caller's transaction rolls back")
    assert _probe_ids() == []


def test_an_error_rolls_the_block_back_and_skips_its_callbacks(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    committed: list[int] = []
    with pytest.raises(IntegrityError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO commit_probe (id) VALUES (1)")
        transaction.on_commit(lambda: committed.append(1))
        execute_committing("INSERT INTO commit_probe (id) VALUES (%s)", [1])
    assert committed == []
    assert _probe_ids() == []
    assert connection.get_autocommit()


def test_without_prepared_statements_the_block_commits_as_usual(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = False
    with transaction.atomic():
        execute_committing("INSERT INTO commit_probe (id) VALUES (%s)", [1])
        assert connection.connection.pgconn.transaction_status != 0  # still open (not IDLE)
    assert _probe_ids() == [1]


# --- a batch that opens its block's transaction --------------------------------------------


def _probe_insert(ident: int) -> tuple[str, list[int]]:
    return "INSERT INTO commit_probe (id) VALUES (%s) RETURNING id", [ident]


def test_a_batch_first_in_its_block_sends_the_begin_with_it(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True

    def block() -> None:
        with transaction.atomic():
            assert execute_together([_probe_insert(1), ("SELECT %s", [2])]) == (2,)
            with connection.cursor() as cursor:  # a later statement: the same transaction
                cursor.execute("INSERT INTO commit_probe (id) VALUES (3)")

    _, messages = _traced(block)
    # BEGIN with the batch; the cursor's statement; the COMMIT. (psycopg's own BEGIN
    # would have been one more answer, waited for alone.)
    assert messages.count(("B", "ReadyForQuery")) == 3, messages
    assert _probe_ids() == [1, 3]
    assert connection.get_autocommit()
    assert connection.connection.autocommit  # as Django leaves it after a block


def test_a_block_opened_by_a_batch_rolls_back_as_a_whole(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_together([_probe_insert(1)])
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO commit_probe (id) VALUES (2)")
        raise RuntimeError("the block fails after the batch")
    assert _probe_ids() == []

    # A savepoint inside it rolls back alone; an error in the batch fails the block.
    with transaction.atomic():
        execute_together([_probe_insert(1)])
        with pytest.raises(IntegrityError), transaction.atomic():
            execute_together([_probe_insert(1)])
        execute_together([_probe_insert(2)])
    assert _probe_ids() == [1, 2]
    with pytest.raises(IntegrityError), transaction.atomic():
        execute_together([_probe_insert(3), _probe_insert(1)])
    assert _probe_ids() == [1, 2]
    assert connection.get_autocommit() and connection.connection.autocommit
    with connection.cursor() as cursor:  # and the connection goes on as usual
        cursor.execute("SELECT 1")


def test_a_batch_after_the_blocks_first_statement_sends_no_begin(settings, probe) -> None:
    settings.DATABASE_PREPARED_STATEMENTS = True

    def block() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            execute_together([_probe_insert(1)])

    _, messages = _traced(block)
    sent = [name for side, name in messages if side == "F"]
    assert sent.count("Query") == 3  # psycopg's BEGIN, the SELECT and the COMMIT: one BEGIN
    assert _probe_ids() == [1]
