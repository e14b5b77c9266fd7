"""What is pushed is byte-identical to what was verified and approved: the working
copy's .git (filters, hooks, config) is never trusted, and a diff that changed after
verification is refused at push (patch_mismatch)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runs import demo
from runs.agent.platform_git import diff_sha256
from runs.engine import run_drive_inline, step_execute
from runs.models import Approval, Patch, Run
from runs.services import run_approve, task_submit
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _branch_file(origin: Path, branch: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"refs/heads/{branch}:{path}"],
        cwd=origin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _drive_until(run: Run, status: str) -> Run:
    for _ in range(60):
        run.refresh_from_db()
        if run.status == status:
            return run
        run = run_drive_inline(run_id=run.id, max_steps=1)
    raise AssertionError(f"run never reached {status}; it is {run.status}")


def _after_decision(run: Run) -> Run:
    run.refresh_from_db()
    step_execute(run_id=str(run.id), step_no=run.step_no)
    return run_drive_inline(run_id=run.id)


def test_a_clean_filter_planted_in_the_working_copy_cannot_change_what_is_pushed(
    workspace, repository, sample_repo
):
    script = demo.fix_script()
    # Before finishing, the agent plants a clean filter that turns + into - on commit
    # (the attack that once pushed `a - b` after `a + b` was approved) and a hook.
    planted = [
        {
            "name": "write_file",
            "arguments": {"path": ".gitattributes", "content": "*.py filter=evil\n"},
        },
        {
            "name": "run_command",
            "arguments": {"command": "git config filter.evil.clean 'sed s/+/-/'"},
        },
        {"name": "run_command", "arguments": {"command": "git config core.hooksPath hooks"}},
    ]
    script["turns"].insert(3, {"content": "Tidying up.", "tool_calls": planted})
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        execution_mode="supervised_pr",
        model_options={"provider": "scripted", "script": script},
    )
    run = _drive_until(submission.run, Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.get(run=run, status=Approval.Status.PENDING)
    approved_diff = Patch.objects.get(pk=approval.patch_id).diff_artifact.content
    assert "+    return a + b" in approved_diff

    run_approve(run=run, by="alice", user=UserFactory(username="alice", is_superuser=True))
    run = _after_decision(run)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    pushed = _branch_file(sample_repo, run.branch, "calc/core.py")
    assert "return a + b" in pushed and "return a - b" not in pushed
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.APPROVED
    pushed_diff = subprocess.run(
        ["git", "diff", "--binary", "--full-index", "--no-renames", run.base_commit, run.branch],
        cwd=sample_repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert diff_sha256(pushed_diff) == approval.patch_sha256


def test_a_diff_changed_after_verification_is_refused_at_push(workspace, repository, sample_repo):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = _drive_until(submission.run, Run.Status.CREATING_PR)
    # Whatever changed the checkpointed diff after it was verified and judged (a bug, a
    # forged checkpoint), the push re-hashes what it would publish.
    checkpoint = dict(run.checkpoint)
    checkpoint["diff"] = checkpoint["diff"].replace("+    return a + b", "+    return a * b")
    Run.objects.filter(pk=run.pk).update(checkpoint=checkpoint)

    run = run_drive_inline(run_id=run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "patch_mismatch")
    failed = run.events.get(type="agent.pr.creation.failed")
    assert failed.data["reason"] == "patch_mismatch"
    branches = subprocess.run(
        ["git", "branch", "--list", run.branch], cwd=sample_repo, capture_output=True, text=True
    ).stdout
    assert not branches.strip(), "nothing may be pushed"


def test_an_approval_does_not_cover_a_different_diff(workspace, repository):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        execution_mode="supervised_pr",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = _drive_until(submission.run, Run.Status.AWAITING_APPROVAL)
    checkpoint = dict(run.checkpoint)
    checkpoint["diff"] = checkpoint["diff"].replace("+    return a + b", "+    return a * b")
    Run.objects.filter(pk=run.pk).update(checkpoint=checkpoint)
    approval = run_approve(
        run=run, by="alice", user=UserFactory(username="alice", is_superuser=True)
    )

    run = _after_decision(run)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "approval_void")
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.VOID
