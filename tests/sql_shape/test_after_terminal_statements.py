"""A finished run's follow-up work: one read when nothing waits; its condition uses indexes."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from runs.services import run_after_terminal

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


S = Run.Status


def test_the_follow_up_work_is_one_read_when_nothing_waits(run) -> None:
    """No batched feedback and no deferred task in the workspace: the run's row, read
    once, says so, and re-admission is not opened at all."""
    Run.objects.filter(pk=run.pk).update(status=S.FAILED)
    with CaptureQueriesContext(connection) as queries:
        run_after_terminal(run_id=run.pk)
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]


def test_the_run_ends_check_for_waiting_work_reads_indexes_only(run) -> None:
    """The after-terminal item's condition, as a prepared statement's generic plan (what
    PostgreSQL runs it with after a few executions): the task by its key and the
    workspace's deferred tasks by their partial index, never a scan of every task."""
    import re

    from runs.services import after_terminal_needed_sql

    condition, params = after_terminal_needed_sql(task=run.task)
    numbered = iter(range(1, len(params) + 1))
    statement = re.sub("%s", lambda _: f"${next(numbered)}", f"SELECT {condition}")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # A scan of a test's few tasks is cheapest: priced out, the plan shows the index.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"PREPARE after_terminal_needed AS {statement}")
        try:
            cursor.execute(
                f"EXPLAIN EXECUTE after_terminal_needed({', '.join(['%s'] * len(params))})", params
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE after_terminal_needed")
    assert "Seq Scan" not in plan, plan
    assert "task_deferred_queue" in plan, plan
