"""The scripted model fixes a real failing test; the run ends with a PR on the local provider."""

from __future__ import annotations

import subprocess

import pytest

from runs import demo
from runs.agent.sandbox import run_workdirs
from runs.engine import run_drive_inline
from runs.models import ModelTurn, PullRequest, Run, ToolCall
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_scripted_fix_ends_with_a_verified_pull_request(workspace, repository):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted-priced", "script": demo.fix_script()},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    calls = list(ToolCall.objects.filter(run=run).order_by("id"))
    assert [c.tool for c in calls] == [
        "list_files",
        "read_file",
        "replace_text",
        "run_command",
        "finish",
    ]
    assert {c.status for c in calls} == {"completed"}
    types = list(run.events.values_list("type", flat=True))
    for kind in ("requested", "started", "completed"):
        assert types.count(f"agent.tool.call.{kind}") == 5
    assert "agent.plan.created" in types
    assert types.index("agent.patch.created") < types.index("agent.verification.passed")
    assert run.verifications.get().outcome == "passed"
    assert run.judgements.get(judge="rules").verdict == "accept"
    assert ModelTurn.objects.filter(run=run).count() == 6  # plan + five acting turns
    assert run.cost_usd > 0 and run.tokens_in > 0
    pr = PullRequest.objects.get(task=submission.task)
    assert pr.provider == "local" and pr.last_run_id == run.id
    head = subprocess.run(
        ["git", "rev-parse", f"refs/heads/{pr.branch}"],
        cwd=repository.clone_url,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert head == pr.head_sha
    tests = subprocess.run(
        ["git", "show", f"{pr.branch}:calc/core.py"],
        cwd=repository.clone_url,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return a + b" in tests
    assert not run_workdirs(run.id)
