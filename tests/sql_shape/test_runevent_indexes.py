"""The timeline's rows carry one index besides their primary key: (run, sequence_no).

Every event is an index insert per index, on the step's commit; a separate index on
``run_id`` alone duplicated the leading column of the unique one. Lookups by run (a
run's events, the cascade when a run is deleted) go through the unique index.
"""

from __future__ import annotations

import pytest

from runs.models import RunEvent
from tests.query_plans import query_plan, table_indexes

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def _indexes() -> dict[str, str]:
    return table_indexes(RunEvent._meta.db_table)


def test_the_timeline_has_the_primary_key_and_the_unique_run_sequence_index_only():
    indexes = _indexes()
    assert set(indexes) == {"runs_runevent_pkey", "runevent_unique_seq"}, indexes
    assert "(run_id, sequence_no)" in indexes["runevent_unique_seq"]


def test_a_runs_events_and_the_cascade_are_served_by_the_unique_index(run):
    in_order = RunEvent.objects.filter(run=run).order_by("sequence_no")
    assert "runevent_unique_seq" in query_plan(in_order)
    # What ON DELETE CASCADE looks for when a run is deleted.
    assert "runevent_unique_seq" in query_plan(RunEvent.objects.filter(run_id=run.pk))
