"""A lease writes no indexed column of the run, so PostgreSQL can take and renew it as a
HOT update (whether it does also depends on free space in the row's page); the reaper
still reads only active runs through an index."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from runs.models import Run
from runs.state import ACTIVE
from tests.query_plans import query_plan

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]

LEASE_COLUMNS = {"lease_owner", "lease_until", "heartbeat_at", "attempt", "wakes"}


def _indexed_columns() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND (a.attnum = ANY(i.indkey) OR pg_get_expr(i.indpred, i.indrelid) LIKE "
            "'%%' || a.attname || '%%') "
            "WHERE i.indrelid = %s::regclass",
            [Run._meta.db_table],
        )
        return {name for (name,) in cursor.fetchall()}


def test_no_index_holds_a_column_the_lease_writes() -> None:
    assert LEASE_COLUMNS.isdisjoint(_indexed_columns())


def test_the_reaper_reads_active_runs_through_an_index() -> None:
    plan = query_plan(
        Run.objects.filter(status__in=ACTIVE, lease_until__lt=timezone.now()).order_by(
            "lease_until"
        )
    )
    # A partial index of active runs (or the status index) serves it, not a scan of
    # every run ever made.
    assert "Seq Scan" not in plan
    assert any(
        index in plan for index in ("run_one_active_per_task", "run_active", "run_status_changed")
    ), plan
