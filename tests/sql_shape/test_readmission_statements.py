"""Re-admission after a run ends costs a few dozen statements however long the queue."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from runs.services import run_after_terminal
from tests.factories import RepositoryFactory
from tests.runs.test_readmission import active, submit

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_readmission_after_a_run_ends_costs_the_same_however_long_the_queue(
    django_capture_on_commit_callbacks,
):
    repository = RepositoryFactory(workspace__max_active_runs=2, max_active_runs=100)
    workspace = repository.workspace
    for n in range(62):
        submit(repository, n)
    first = Run.objects.filter(task__workspace=workspace).order_by("created_at").first()
    Run.objects.filter(pk=first.pk).update(status=Run.Status.COMPLETED)

    with CaptureQueriesContext(connection) as queries:
        run_after_terminal(run_id=first.pk)
    assert active(workspace) == 2
    # One lock, one count, one batch of candidates and one run started: a few dozen
    # statements, not a locked admission check for each of the 60 waiting tasks.
    assert len(queries) <= 40, [q["sql"][:80] for q in queries.captured_queries]
