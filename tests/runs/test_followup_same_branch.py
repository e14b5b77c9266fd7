"""Follow-up runs continue on the task's branch and PR; feedback that arrives while a run
is active is batched into the next follow-up; budgets carry over."""

from __future__ import annotations

import subprocess

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import ModelTurn, PullRequest, Run, Task
from runs.services import task_followup, task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _edit(old: str, new: str) -> dict:
    return {
        "tool_calls": [
            {"name": "replace_text", "arguments": {"path": "calc/core.py", "old": old, "new": new}}
        ]
    }


FINISH = {"tool_calls": [{"name": "finish", "arguments": {}}]}


def _show(repository, ref: str) -> str:
    return subprocess.run(
        ["git", "show", ref], cwd=repository.clone_url, capture_output=True, text=True, check=True
    ).stdout


def test_followups_push_to_the_same_branch_and_pull_request(workspace, repository):
    script = demo.fix_script()
    script["followups"] = {
        "2": {
            "turns": [_edit("    return a * b", '    """Multiply."""\n    return a * b'), FINISH]
        },
        "3": {"turns": [_edit("    return a + b", '    """Add."""\n    return a + b'), FINISH]},
    }
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )
    task = submission.task
    first = run_drive_inline(run_id=submission.run.id)
    assert first.status == Run.Status.COMPLETED, first.failure_detail
    first_head = PullRequest.objects.get(task=task).head_sha

    second = task_followup(task=task, feedback="Please document multiply().", by="reviewer")
    assert second is not None and second.run_no == 2
    # A second review arrives while run 2 is active: it waits for the next follow-up.
    assert task_followup(task=task, feedback="And add() too.", by="reviewer") is None
    assert Task.objects.get(pk=task.pk).pending_feedback == "And add() too."

    second = run_drive_inline(run_id=second.id)

    assert second.status == Run.Status.COMPLETED, second.failure_detail
    assert second.base_commit == first_head
    assert second.events.filter(type="agent.pr.updated").count() == 1
    third = Run.objects.get(task=task, run_no=3)  # started when run 2 ended
    assert third.feedback == "And add() too."
    assert Task.objects.get(pk=task.pk).pending_feedback == ""
    third = run_drive_inline(run_id=third.id)
    assert third.status == Run.Status.COMPLETED, third.failure_detail

    pr = PullRequest.objects.get(task=task)
    assert pr.last_run_id == third.id
    source = _show(repository, f"{pr.branch}:calc/core.py")
    assert "return a + b" in source and '"""Multiply."""' in source and '"""Add."""' in source
    commits = subprocess.run(
        ["git", "rev-list", "--count", f"main..{pr.branch}"],
        cwd=repository.clone_url,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert commits == "3"


def test_budgets_are_cumulative_over_followups(workspace, repository):
    script = demo.fix_script()
    script["followups"] = {"2": {"turns": [_edit("return a + b", "return b + a"), FINISH]}}
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )
    first = run_drive_inline(run_id=submission.run.id)
    assert first.status == Run.Status.COMPLETED
    used = ModelTurn.objects.filter(run__task=submission.task).count()
    # Room for the follow-up's plan turn only.
    Task.objects.filter(pk=submission.task.pk).update(budget={"model_turns": used + 1})

    second = task_followup(task=submission.task, feedback="Swap the operands.", by="reviewer")
    second = run_drive_inline(run_id=second.id)

    assert (second.status, second.failure_reason) == (Run.Status.FAILED, "budget_model_turns")
    assert ModelTurn.objects.filter(run=second).count() == 1
