"""The outbox's indexes on its history are partial: an insert adds entries to the pending
ones (which the relay reads) and to no index of published rows but its keys'.

The relay reads pending rows only. The one reader of a partition's published history is
the replay of a deferred submission, which reads its ``agent.task.deferred`` event; only
those rows are indexed by partition.
"""

from __future__ import annotations

import pytest
from django.db import connection

from agentplatform.api.selectors import submission_outcome
from jobs.models import OutboxEvent
from runs.models import Task
from runs.services import task_submit
from tests.factories import RepositoryFactory
from tests.query_plans import query_plan, table_indexes

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def _indexes() -> dict[str, str]:
    return table_indexes(OutboxEvent._meta.db_table)


def test_every_index_but_the_keys_is_partial():
    indexes = _indexes()
    keys = {name for name, definition in indexes.items() if "UNIQUE" in definition}
    assert len(keys) == 2, indexes  # the primary key and event_id
    partial = {name: d for name, d in indexes.items() if name not in keys}
    assert set(partial) == {"outbox_pending", "outbox_pending_partition", "outbox_deferred"}
    assert all(" WHERE " in definition for definition in partial.values()), partial


def test_a_deferred_submissions_replay_reads_its_deferral_by_the_partial_index():
    repository = RepositoryFactory(workspace__max_active_runs=1)
    task_submit(workspace=repository.workspace, repository=repository, instruction="a")
    deferred = task_submit(
        workspace=repository.workspace, repository=repository, instruction="b", idempotency_key="k"
    )
    assert deferred.task.status == Task.Status.DEFERRED
    lookup = OutboxEvent.objects.filter(
        partition_key=str(deferred.task.id), type="agent.task.deferred"
    ).order_by("id")
    assert "outbox_deferred" in query_plan(lookup)

    # Re-admitted later, the task's own reason is gone; the replay still answers with it.
    Task.objects.filter(pk=deferred.task.pk).update(status=Task.Status.RUNNING, status_reason="")
    replay = task_submit(
        workspace=repository.workspace, repository=repository, instruction="b", idempotency_key="k"
    )
    outcome = submission_outcome(submission=replay)
    assert outcome["status"] == Task.Status.DEFERRED
    assert "limit" in outcome["reason"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_the_outbox_writable_while_it_builds():
    """A plain CREATE INDEX blocks every insert into the outbox (every step's and every
    submission's) until it has read the whole table; CONCURRENTLY does not."""
    from io import StringIO

    from django.core.management import call_command
    from django.db.migrations.loader import MigrationLoader

    migration = MigrationLoader(connection).get_migration("jobs", "0007_outbox_deferred_index")
    assert migration.atomic is False
    out = StringIO()
    call_command("sqlmigrate", "jobs", "0007", stdout=out)
    statements = [
        line for line in out.getvalue().splitlines() if line and not line.startswith("--")
    ]
    assert statements[0].startswith('CREATE INDEX CONCURRENTLY "outbox_deferred"'), statements
    assert statements[1].startswith('DROP INDEX CONCURRENTLY IF EXISTS "outbox_partition"')
