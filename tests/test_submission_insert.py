"""A submission's one-statement INSERT writes the rows the ORM would: every column of the
task and of its run (JSON rows with the models' defaults), the timeline and the outbox
as ``events_record`` writes them, accepted and deferred alike."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import OutboxEvent
from runs import dispatch, services
from runs.models import Run, RunEvent, Task
from runs.services import (
    SUBMISSION_OUTBOX_COLUMNS,
    SUBMISSION_TIMELINE_COLUMNS,
    task_submit,
)
from runs.timeline import events_record
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db

# Made anew by every submission.
_FRESH = {"id", "created_at", "updated_at", "status_changed_at", "traceparent", "task_id"}


def _submit(repository: Any, key: str) -> services.Submission:
    return task_submit(
        workspace=repository.workspace,
        repository=repository,
        instruction="Fix the flaky test",
        requested_by="ann",
        idempotency_key=key,
        budget={"model_turns": 3},
        model_options={"script": [{"say": "hi"}]},
        source_ref={"issue": 7},
        priority=10,
        target_branch="main",
    )


def _orm_insert(*, task: Any, run: Any, events: list[Any], admitting: bool = False) -> bool:
    """The rows as the ORM writes them: save() and events_record's bulk_create."""
    assert not admitting
    if run is not None:
        dispatch.run_wake_on_commit(run_id=run.id, step_no=0, status=run.status)
    task.save(force_insert=True)
    if run is not None:
        run.save(force_insert=True)
        last = run.last_sequence_no
        events_record(task=task, run=run, events=events, reserved=(last, len(events)))
    else:
        events_record(task=task, run=None, events=events)
    return True


def _orm_submit(monkeypatch: pytest.MonkeyPatch, repository: Any, key: str) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(services, "_lanes", lambda: 0)
        patched.setattr(services, "_submission_insert", _orm_insert)
        with CaptureQueriesContext(connection) as queries:
            submission = _submit(repository, key)
    statements = [q["sql"].split() for q in queries.captured_queries]
    inserts = [words[2] for words in statements if words[0] == "INSERT"]
    assert inserts[:2] == ['"runs_task"', '"runs_run"' if submission.run else '"jobs_outboxevent"']
    return submission


def _columns(instance: Any) -> dict[str, Any]:
    fields = type(instance)._meta.concrete_fields
    return {f.attname: getattr(instance, f.attname) for f in fields if f.attname not in _FRESH}


def _events(run: Run | None, task: Task) -> tuple[list[Any], list[Any]]:
    timeline = (
        list(RunEvent.objects.filter(run=run).values_list("sequence_no", "type", "data", "actor"))
        if run is not None
        else []
    )
    key = str(run.id if run is not None else task.id)
    outbox = []
    for row in OutboxEvent.objects.filter(partition_key=key).order_by("id"):
        payload = {
            k: v
            for k, v in row.payload.items()
            if k not in ("id", "time", "traceparent", "taskid", "correlationid", "subject", "runid")
        }
        outbox.append((row.type, row.attempts, row.last_error, row.published_at, payload))
    return timeline, outbox


@pytest.mark.parametrize("limit", [10, 0], ids=["accepted", "deferred"])
def test_the_one_statement_writes_what_the_orm_writes(monkeypatch, limit: int) -> None:
    repository = RepositoryFactory(workspace=WorkspaceFactory(), max_active_runs=limit)
    one = _submit(repository, "one")
    orm = _orm_submit(monkeypatch, repository, "orm")
    assert (one.run is None, orm.run is None) == (limit == 0, limit == 0)

    stored_one = Task.objects.get(pk=one.task.pk)
    stored_orm = Task.objects.get(pk=orm.task.pk)
    assert {**_columns(stored_one), "idempotency_key": "k"} == {
        **_columns(stored_orm),
        "idempotency_key": "k",
    }
    # The instance returned is the stored row.
    assert _columns(one.task) == _columns(stored_one)
    assert one.task.created_at == stored_one.created_at
    assert one.task.traceparent == stored_one.traceparent
    assert not one.task._state.adding
    if one.run is not None:
        assert _columns(Run.objects.get(pk=one.run.pk)) == _columns(Run.objects.get(pk=orm.run.pk))
        assert _columns(one.run) == _columns(Run.objects.get(pk=one.run.pk))
    assert _events(one.run, one.task) == _events(orm.run, orm.task)
    timeline, outbox = _events(one.run, one.task)
    assert len(outbox) == (4 if limit else 2) and len(timeline) == (4 if limit else 0)


def test_the_event_columns_are_every_column_the_orm_writes() -> None:
    timeline = [f.column for f in RunEvent._meta.concrete_fields]
    outbox = [f.column for f in OutboxEvent._meta.concrete_fields if f.name != "id"]
    assert list(SUBMISSION_TIMELINE_COLUMNS) == timeline
    assert list(SUBMISSION_OUTBOX_COLUMNS) == outbox


def test_a_reused_key_fails_the_statement_and_writes_nothing(monkeypatch) -> None:
    repository = RepositoryFactory(workspace=WorkspaceFactory(), max_active_runs=10)
    first = _submit(repository, "same")
    again = _submit(repository, "same")
    assert (again.created, again.task.pk, again.run.pk) == (False, first.task.pk, first.run.pk)
    assert Task.objects.count() == Run.objects.count() == 1
    assert RunEvent.objects.count() == OutboxEvent.objects.count() == 4
