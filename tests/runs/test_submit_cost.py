"""A submission writes the task with its final status, the run's first sequence numbers
taken by its INSERT, and finds a repeated Idempotency-Key by its unique constraint."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from runs.models import Run, RunEvent, Task
from runs.services import task_submit
from runs.timeline import event_record

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(api: APIClient, repository, key: str | None = None, instruction: str = "Fix it"):
    headers = {"Idempotency-Key": key} if key else {}
    return api.post(
        "/api/tasks/",
        data=json.dumps({"repository": repository.pk, "instruction": instruction}),
        content_type="application/json",
        headers=headers,
    )


def _submission_statements(api: APIClient, repository) -> list[str]:
    _submit(api, repository, key=str(uuid.uuid4()))  # warm
    with CaptureQueriesContext(connection) as queries:
        response = _submit(api, repository, key=str(uuid.uuid4()))
    assert response.status_code == 202
    return [q["sql"] for q in queries.captured_queries]


def test_in_a_callers_transaction_a_repeated_key_rolls_back_only_its_own_attempt(
    submitter,
) -> None:
    """Inside a transaction of the caller's (a webhook's command, an admin action) the
    submission is a savepoint of it: the repeated key's failed INSERT leaves the caller's
    transaction usable."""
    _, repository = submitter
    with transaction.atomic():
        first = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction="Fix it",
            idempotency_key="k",
        )
        again = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction="Fix it",
            idempotency_key="k",
        )
        other = task_submit(
            workspace=repository.workspace, repository=repository, instruction="Another"
        )
    assert (again.created, again.task.pk) == (False, first.task.pk)
    assert Task.objects.count() == 2 and other.task.status == Task.Status.RUNNING


def test_the_submitted_task_and_its_timeline_are_as_before(submitter) -> None:
    api, repository = submitter
    body = _submit(api, repository).json()
    task = Task.objects.get(pk=body["task_id"])
    run = Run.objects.get(pk=body["run_id"])
    assert (task.status, task.status_reason, run.last_sequence_no) == ("running", "", 4)
    assert list(RunEvent.objects.filter(run=run).values_list("sequence_no", "type")) == [
        (1, "agent.task.submitted"),
        (2, "agent.task.accepted"),
        (3, "agent.task.queued"),
        (4, "agent.run.queued"),
    ]
    # The next fact on the run continues the sequence without a gap.
    with transaction.atomic():
        event_record(task=task, run=run, type="agent.run.started")
    assert RunEvent.objects.filter(run=run).order_by("-sequence_no").first().sequence_no == 5


def test_a_deferred_submission_is_written_deferred_with_its_reason(submitter) -> None:
    api, repository = submitter
    repository.max_active_runs = 1
    repository.save()
    assert _submit(api, repository).json()["status"] == "queued"
    deferred = _submit(api, repository).json()
    assert deferred["status"] == "deferred"
    assert deferred["reason"] == "repository at its limit of 1 active runs"
    task = Task.objects.get(pk=deferred["task_id"])
    assert (task.status, task.status_reason) == ("deferred", deferred["reason"])


def test_a_repeated_key_answers_the_original_and_creates_nothing(submitter) -> None:
    api, repository = submitter
    key = str(uuid.uuid4())
    first = _submit(api, repository, key=key)
    again = _submit(api, repository, key=key)
    assert (again.status_code, again.json()) == (202, first.json())
    assert Task.objects.count() == Run.objects.count() == 1
    other = _submit(api, repository, key=key, instruction="Something else")
    assert other.status_code == 422
    assert Task.objects.count() == 1


def _prepared_submission_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [s for (s,) in cursor.fetchall() if "advisory" in s or "runs_" in s]
