"""Timestamps are read by psycopg's C parser, with the values Django's loader gives."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db import connection

from agentplatform import pgtime
from runs.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def _loader_class() -> Any:
    from psycopg.pq import Format

    with connection.cursor() as cursor:
        return cursor.cursor.adapters.get_loader(pgtime.TIMESTAMPTZ_OID, Format.TEXT)


def test_cursors_use_the_c_loader_and_django_keeps_it() -> None:
    assert pgtime.C_LOADER is not None, "psycopg's C implementation is installed"
    # Django compares its time zone with the connection's loader before every cursor
    # and registers its own on the cursor when they differ.
    assert _loader_class() is pgtime.UtcTimestamptzLoader


def test_times_read_are_the_values_djangos_loader_reads() -> None:
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    RunFactory.create_batch(3)
    columns = ("created_at", "status_changed_at", "started_at", "finished_at")
    fast = list(Run.objects.order_by("id").values_list(*columns))
    sql = "SELECT now(), now() - interval '1 year 3 days 5.123456 seconds', NULL::timestamptz"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        fast_raw = cursor.fetchone()

    # Django's own loader, for one cursor.
    with connection.cursor() as cursor:
        register_tzloader(connection.timezone, cursor.cursor)
        cursor.execute(
            "SELECT created_at, status_changed_at, started_at, finished_at "
            "FROM runs_run ORDER BY id"
        )
        slow = [tuple(row) for row in cursor.fetchall()]
    assert fast == slow
    assert any(value is not None for row in fast for value in row)
    for row in fast:
        for value in row:
            assert value is None or value.tzinfo is datetime.UTC
    assert fast_raw[0].tzinfo is datetime.UTC and fast_raw[2] is None
