"""The lease statement loads the run, its task, repository and workspace in one query."""

from __future__ import annotations

import pytest

from runs.engine import (
    lease_acquire_loaded,
)
from runs.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_the_lease_statement_loads_the_run_as_leased(run, django_assert_num_queries):
    Run.objects.filter(pk=run.pk).update(checkpoint={"plan": ["a", "b"]})
    with django_assert_num_queries(1):
        acquired = lease_acquire_loaded(run_id=str(run.id), step_no=0, owner="w")
    assert acquired is not None
    lease, loaded = acquired
    with django_assert_num_queries(0):
        assert (loaded.lease_owner, loaded.attempt, lease.attempt) == ("w", 1, 1)
        assert loaded.lease_until is not None and loaded.checkpoint == {"plan": ["a", "b"]}
        assert loaded.task.pk == run.task_id and isinstance(loaded.task.budget, dict)
        assert loaded.task.repository.pk == run.task.repository_id
        assert loaded.task.workspace.pk == run.task.workspace_id
    fresh = Run.objects.get(pk=run.pk)
    assert (fresh.lease_owner, fresh.attempt) == ("w", 1)
