"""Claiming a due work item is one statement."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import WorkItem
from jobs.work import _claim

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_a_due_item_is_claimed_in_one_statement() -> None:
    item = WorkItem.objects.create(
        kind="k", key="1", queue="events", due_at=timezone.now() - timedelta(seconds=1)
    )
    with CaptureQueriesContext(connection) as queries:
        claimed, why = _claim(item.pk)
    assert why == "claimed" and claimed is not None
    assert len(queries) == 1
