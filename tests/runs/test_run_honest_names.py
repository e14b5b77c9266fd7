"""What the console and the API call things is what they are: a task waiting for a person
says so, a lease generation is not an attempt, a failed clone is not an agent attempt,
and a retry that fails does not un-deliver a task whose pull request is open."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from runs import demo, engine
from runs.models import Membership, PullRequest, Run, Task
from runs.services import run_approve, task_retry, task_submit
from runs.state import TERMINAL
from tests.factories import RepositoryFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _drive(run: Run) -> Run:
    for _ in range(100):
        run.refresh_from_db()
        if run.status in TERMINAL or run.status == Run.Status.AWAITING_APPROVAL:
            return run
        engine.step_execute(run_id=str(run.id), step_no=run.step_no)
    raise AssertionError(f"run stuck in {run.status}")


@pytest.fixture(autouse=True)
def _no_wakeups():
    yield
    redis.Redis.from_url(settings.REDIS_URL).delete("agent", "verify", "events")


def _options() -> dict:
    return {"provider": "scripted", "script": demo.fix_script()}


def test_a_task_waiting_for_approval_says_so_and_runs_again_once_approved(workspace, repository):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options=_options(),
        execution_mode=Task.Mode.SUPERVISED_PR,
    )

    waiting = _drive(submission.run)

    assert waiting.status == Run.Status.AWAITING_APPROVAL
    assert Task.objects.get(pk=submission.task.pk).status == "awaiting_approval"
    run_approve(
        run=waiting, by="reviewer", user=UserFactory(username="reviewer", is_superuser=True)
    )
    engine.step_execute(run_id=str(waiting.id), step_no=Run.objects.get(pk=waiting.pk).step_no)
    assert Task.objects.get(pk=submission.task.pk).status == Task.Status.RUNNING
    assert _drive(waiting).status == Run.Status.COMPLETED
    assert Task.objects.get(pk=submission.task.pk).status == Task.Status.COMPLETED


def test_retrying_a_delivered_task_that_fails_leaves_the_task_completed(workspace, repository):
    submission = task_submit(
        workspace=workspace, repository=repository, instruction="Fix add()", model_options={}
    )
    # First run: delivers a pull request with the fix.
    Task.objects.filter(pk=submission.task.pk).update(model_options=_options())
    assert _drive(submission.run).status == Run.Status.COMPLETED
    assert PullRequest.objects.get(task=submission.task).state == "open"
    # The retry meets a repository that vanished: it fails at the clone.
    repository.clone_url = str(repository.clone_url) + "-gone"
    repository.save()

    retry = task_retry(task=submission.task, by="oncall")
    failed = _drive(retry)

    assert failed.status == Run.Status.FAILED
    task = Task.objects.get(pk=submission.task.pk)
    assert task.status == Task.Status.COMPLETED
    assert failed.failure_reason in task.status_reason
    assert not retry.events.filter(type="agent.task.failed").exists()


def test_a_clone_failure_is_no_agent_attempt_and_leases_are_not_attempts(workspace):
    repository = RepositoryFactory(workspace=workspace, clone_url="/nonexistent/repository")
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user)
    submission = task_submit(
        workspace=workspace, repository=repository, instruction="Fix", model_options=_options()
    )

    run = _drive(submission.run)

    assert run.status == Run.Status.FAILED
    assert run.attempt >= 1  # leases were taken...
    client = APIClient()
    client.force_authenticate(user)
    body = client.get(f"/api/runs/{run.id}/").json()
    # ...but the agent never tried: no patch, no attempt spent.
    assert body["current_step"]["agent_attempts"] == 0
    assert body["budget"]["agent_attempts"]["used"] == 0
    assert body["lease_generation"] == run.attempt
    assert "attempt" not in body
