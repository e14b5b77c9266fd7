"""Adding a task from the admin goes through the submission service, like the API."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group

from jobs.models import OutboxEvent
from runs.models import Run, Task
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.factories import UserFactory

INTERNAL_FIELDS = (
    "idempotency_key",
    "request_fingerprint",
    "usage",
    "status",
    "status_reason",
    "workspace",
    "source",
    "requested_by",
    "pending_feedback",
    "model_options",
)


def _operator_client(client: Any) -> Any:
    user = UserFactory(username="oncall", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    client.force_login(user)
    return client


def _form(repository: Any, **extra: Any) -> dict[str, Any]:
    return {
        "repository": repository.pk,
        "instruction": "Fix add()",
        "task_type": "change",
        "execution_mode": "supervised_pr",
        "risk_level": "high",
        "target_branch": "",
        "priority": "10",
        "agent_attempts": "2",
        "model_turns": "",
        "cost_usd": "0.5",
        "wall_clock_seconds": "",
        "runs-TOTAL_FORMS": "0",
        "runs-INITIAL_FORMS": "0",
        **extra,
    }


@pytest.mark.django_db
def test_the_add_form_shows_no_internal_field(client: Any, repository: Any) -> None:
    page = _operator_client(client).get("/admin/runs/task/add/")

    assert page.status_code == 200
    html = page.content.decode()
    for name in INTERNAL_FIELDS:
        assert f'name="{name}"' not in html, name
    assert 'name="instruction"' in html and 'name="cost_usd"' in html


@pytest.mark.django_db
def test_internal_fields_posted_anyway_are_ignored(client: Any, repository: Any) -> None:
    response = _operator_client(client).post(
        "/admin/runs/task/add/",
        _form(repository, status="completed", idempotency_key="x", usage='{"a": 1}'),
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    task = Task.objects.get()
    assert (task.status, task.idempotency_key, task.usage) == ("running", None, {})
    assert (task.source, task.requested_by) == ("admin", "oncall")
    assert (task.execution_mode, task.risk_level, task.priority) == ("supervised_pr", "high", 10)
    assert task.budget == {"agent_attempts": 2, "cost_usd": 0.5}
    assert task.workspace_id == repository.workspace_id
    # Submitted exactly like the API: a run, the submission events, an outbox entry.
    assert task.runs.count() == 1
    assert OutboxEvent.objects.filter(type="agent.task.submitted").exists()


@pytest.mark.django_db
def test_tasks_are_not_edited_in_the_admin(client: Any, repository: Any) -> None:
    operator = _operator_client(client)
    operator.post("/admin/runs/task/add/", _form(repository))
    task = Task.objects.get()

    operator.post(f"/admin/runs/task/{task.pk}/change/", {"instruction": "rm -rf /"})

    task.refresh_from_db()
    assert task.instruction == "Fix add()"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_task_added_in_the_admin_runs_on_a_worker(
    client: Any, repository: Any, start_worker: Any
) -> None:
    worker = start_worker()
    _operator_client(client).post(
        "/admin/runs/task/add/", _form(repository, execution_mode="dry_run", risk_level="low")
    )
    run = Run.objects.get()

    def ended() -> Run | None:
        run.refresh_from_db()
        return run if run.status in TERMINAL else None

    try:
        wait_for(ended, timeout=150, message="the admin's task to run")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: run {run.status} step {run.step_no}, task {run.task.status} "
            f"{run.task.status_reason!r}; worker: {worker.output()[-3000:]}"
        ) from None
    types = list(run.events.values_list("type", flat=True))
    assert "agent.run.started" in types
    assert run.status_changed_at is not None and run.started_at is not None
