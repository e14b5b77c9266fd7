"""A real worker process, real Redis messages, real git: a task runs to a pull request."""

from __future__ import annotations

import subprocess

import pytest

from runs import demo
from runs.models import PullRequest, Run
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _terminal(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.status in TERMINAL else None


def test_task_runs_to_a_pull_request_on_a_real_worker(workspace, repository, start_worker):
    start_worker()
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = wait_for(lambda: _terminal(submission.run), timeout=90, message="run to end")

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    statuses = [e.data["to"] for e in run.events.filter(type="agent.run.status.changed")]
    assert statuses == [
        "preparing",
        "context_loading",
        "planning",
        "running",
        "verifying",
        "judging",
        "creating_pr",
        "completed",
    ]
    sequence = list(run.events.values_list("sequence_no", flat=True))
    assert sequence == list(range(1, len(sequence) + 1))
    pr = PullRequest.objects.get(task=submission.task)
    branch_head = subprocess.run(
        ["git", "rev-parse", f"refs/heads/{pr.branch}"],
        cwd=repository.clone_url,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert branch_head == pr.head_sha
    fixed = subprocess.run(
        ["git", "show", f"{pr.branch}:calc/core.py"],
        cwd=repository.clone_url,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return a + b" in fixed
