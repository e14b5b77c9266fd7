"""Under the lanes' limits a submission takes one lane with its count, then the exact check."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import fairness
from runs.models import Run
from runs.services import task_submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]


def test_under_limits_no_larger_than_the_lanes_a_submission_takes_the_exact_check_at_once(
    settings, monkeypatch
) -> None:
    """A lane keeps one run per lane in reserve: under the default limits (a repository
    of 3, 8 lanes) it can admit nothing, and the one-round-trip attempt and the lane's
    two counts only handed every submission on to the exclusive check. The lane now
    counts once, exactly, and defers or hands on; admission still holds the limit."""
    from tests.factories import RepositoryFactory, WorkspaceFactory

    settings.ADMISSION_LANES = 8
    # The fair-share snapshot (read at most once a second by a dispatch) is taken now and
    # kept, so that its read does not land among the counted statements of a submission.
    monkeypatch.setattr(fairness, "SNAPSHOT_SECONDS", 3600.0)
    fairness.shares_forget()
    fairness.shares()
    workspace = WorkspaceFactory(max_active_runs=10)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=3)
    statuses = []
    for n in range(4):
        with CaptureQueriesContext(connection) as queries:
            submission = task_submit(
                workspace=workspace, repository=repository, instruction=f"task {n}"
            )
        statuses.append(submission.task.status)
        statements = [q["sql"] for q in queries.captured_queries]
        lanes = [sql for sql in statements if "pg_try_advisory_xact_lock" in sql]
        counts = [sql for sql in statements if '"runs_activeruncount"' in sql]
        exclusive = [sql for sql in statements if "count(pg_advisory_xact_lock" in sql]
        # One lane with its count (no one-round-trip attempt, no second count), then
        # the exclusive check for a submission that fits, or the deferral in the lane.
        assert len(lanes) == 1 and "INSERT" not in lanes[0], statements
        fits = n < 3
        assert len(exclusive) == int(fits), statements
        assert len(counts) == 1 + int(fits), statements
    assert statuses == ["running", "running", "running", "deferred"]
    Run.objects.filter(task__repository=repository).update(status="cancelled")
