"""Claiming a due work item reads its row under a lock and leases it: one SELECT ... FOR
UPDATE and one UPDATE, in one transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import WorkItem
from jobs.work_execution import _claim

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_a_due_item_is_claimed_with_one_locked_read_and_one_update() -> None:
    item = WorkItem.objects.create(
        kind="k", key="1", queue="events", due_at=timezone.now() - timedelta(seconds=1)
    )
    with CaptureQueriesContext(connection) as queries:
        claimed, why = _claim(item.pk)
    assert why == "claimed" and claimed is not None
    statements = [q["sql"] for q in queries.captured_queries]
    data = [sql for sql in statements if sql.split()[0] in ("SELECT", "UPDATE")]
    assert len(data) == 2, statements
    assert data[0].startswith("SELECT") and data[0].endswith("FOR UPDATE"), statements
    assert data[1].startswith("UPDATE"), statements
