"""Every index of our tables earns its writes: none repeats the leading columns of another.

An index whose columns begin another index adds an index insert to every row written
(and, on a table whose indexed columns change, to every update) while the longer index
already serves each lookup it would. Foreign keys are the usual source: Django indexes
each one unless told otherwise, also when a unique constraint starts with it.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

from runs.models import Run, Task
from tests.query_plans import query_plan

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]

OUR_APPS = ("runs", "jobs", "webhooks")


def _our_tables() -> list[str]:
    return [
        model._meta.db_table
        for app in OUR_APPS
        for model in apps.get_app_config(app).get_models()
        if model._meta.managed
    ]


def _covered_indexes() -> list[str]:
    """Plain indexes (not unique, not partial, default operator classes) whose columns
    are the first columns of another full index of the same table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH idx AS (
                SELECT i.indrelid::regclass::text AS tbl, c.relname AS name,
                       i.indkey::text AS keys,
                       i.indisunique AS uniq, i.indpred IS NOT NULL AS partial,
                       pg_get_indexdef(i.indexrelid) AS def
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            )
            SELECT a.tbl || ': ' || a.def || ' is covered by ' || b.def
            FROM idx a JOIN idx b ON a.tbl = b.tbl AND a.name <> b.name
            WHERE a.tbl = ANY(%s) AND NOT a.uniq AND NOT a.partial AND NOT b.partial
              AND a.def NOT LIKE '%%_pattern_ops%%' AND b.def NOT LIKE '%%_pattern_ops%%'
              AND (b.keys = a.keys OR b.keys LIKE a.keys || ' %%')
            ORDER BY 1
            """,
            [_our_tables()],
        )
        return [row[0] for row in cursor.fetchall()]


def test_no_index_repeats_the_leading_columns_of_another():
    assert _covered_indexes() == []


def test_lookups_by_the_unindexed_foreign_keys_use_the_covering_index(run):
    # The cascade of a task's deletion and a task's runs.
    assert "run_unique_task_run_no" in query_plan(Run.objects.filter(task_id=run.task_id))
    # A workspace's tasks (the cascade of a workspace's deletion, the API's scope).
    assert "task_ws_created" in query_plan(Task.objects.filter(workspace_id=run.workspace_id))
