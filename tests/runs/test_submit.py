"""Submitting a task: task, run, events and outbox in one transaction; dispatch on commit."""

from __future__ import annotations

import pytest

from jobs.models import OutboxEvent
from runs.models import Run, Task
from runs.services import IdempotencyConflict, task_submit, tasks_readmit
from tests.factories import RepositoryFactory

pytestmark = pytest.mark.django_db


def submit(repository, **kwargs):
    return task_submit(
        workspace=repository.workspace,
        repository=repository,
        instruction=kwargs.pop("instruction", "Fix add()"),
        **kwargs,
    )


def test_submit_records_task_run_events_and_outbox_and_dispatches_on_commit(
    django_capture_on_commit_callbacks,
):
    repository = RepositoryFactory()
    with django_capture_on_commit_callbacks() as callbacks:
        submission = submit(repository, requested_by="alice")

    assert submission.created
    assert submission.task.status == Task.Status.RUNNING
    run = submission.run
    assert run is not None and run.status == Run.Status.QUEUED and run.run_no == 1
    types = list(run.events.order_by("sequence_no").values_list("type", flat=True))
    assert types == [
        "agent.task.submitted",
        "agent.task.accepted",
        "agent.task.queued",
        "agent.run.queued",
    ]
    outbox = OutboxEvent.objects.filter(partition_key=str(run.id)).order_by("id")
    assert [row.type for row in outbox] == types
    envelope = outbox[0].payload
    assert envelope["specversion"] == "1.0"
    assert envelope["runid"] == str(run.id) and envelope["taskid"] == str(run.task_id)
    assert envelope["sequence"] == 1
    assert len(callbacks) >= 1, "the first step is dispatched only on commit"


def test_nothing_is_dispatched_before_commit(django_capture_on_commit_callbacks):
    repository = RepositoryFactory()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        submit(repository)
    # The wake-up is a pending callback, not a message already sent.
    assert callbacks


def test_the_same_idempotency_key_and_body_returns_the_original_task():
    repository = RepositoryFactory()
    first = submit(repository, idempotency_key="k-1")
    again = submit(repository, idempotency_key="k-1")
    assert not again.created
    assert again.task.pk == first.task.pk and again.run.pk == first.run.pk
    assert Task.objects.count() == 1 and Run.objects.count() == 1


def test_the_same_idempotency_key_with_another_body_is_refused_and_changes_nothing():
    repository = RepositoryFactory()
    submit(repository, idempotency_key="k-1")
    with pytest.raises(IdempotencyConflict):
        submit(repository, idempotency_key="k-1", instruction="Something else")
    assert Task.objects.count() == 1


def test_over_the_workspace_limit_the_task_is_deferred_then_readmitted():
    repository = RepositoryFactory(workspace__max_active_runs=1)
    first = submit(repository)
    second = submit(repository)
    assert second.run is None
    assert second.task.status == Task.Status.DEFERRED
    assert "limit" in second.task.status_reason
    deferred = OutboxEvent.objects.filter(
        partition_key=str(second.task.id), type="agent.task.deferred"
    )
    assert deferred.exists()

    assert tasks_readmit() == 0  # still no capacity
    Run.objects.filter(pk=first.run.pk).update(status=Run.Status.COMPLETED)
    assert tasks_readmit() == 1
    second.task.refresh_from_db()
    assert second.task.status == Task.Status.RUNNING
    assert second.task.runs.get().status == Run.Status.QUEUED


def test_a_repository_of_another_workspace_is_refused():
    from runs.services import CommandRefused

    repository = RepositoryFactory()
    other = RepositoryFactory()
    with pytest.raises(CommandRefused):
        task_submit(workspace=other.workspace, repository=repository, instruction="x")
    assert Task.objects.count() == 0
