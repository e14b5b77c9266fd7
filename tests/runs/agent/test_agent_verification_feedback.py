"""A transcript that breaks the tests is told why by the verifier and then fixes it."""

from __future__ import annotations

import json

import pytest

from runs.engine import run_drive_inline
from runs.models import Artifact, ModelTurn, PullRequest, Run
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _edit(old: str, new: str) -> dict:
    return {
        "tool_calls": [
            {"name": "replace_text", "arguments": {"path": "calc/core.py", "old": old, "new": new}}
        ]
    }


FINISH = {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]}


def test_failed_verification_is_fed_back_and_the_next_attempt_passes(workspace, repository):
    script = {
        "turns": [
            _edit("return a - b", "return a - b + 1"),
            FINISH,  # still wrong
            _edit("return a - b + 1", "return a + b"),
            FINISH,  # after the feedback
        ]
    }
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    outcomes = list(
        run.verifications.order_by("patch__attempt_no").values_list("outcome", flat=True)
    )
    assert outcomes == ["test_failure", "passed"]
    statuses = [e.data["to"] for e in run.events.filter(type="agent.run.status.changed")]
    assert statuses == [
        "preparing",
        "context_loading",
        "planning",
        "running",
        "verifying",
        "running",
        "verifying",
        "judging",
        "creating_pr",
        "completed",
    ]
    # The turn after the failure was asked with the verifier's summary in the conversation.
    after = ModelTurn.objects.filter(run=run, purpose="act").order_by("step_no", "turn_no")[2]
    request = json.loads(Artifact.objects.get(pk=after.request_artifact_id).content)
    feedback = [m["content"] for m in request["messages"] if m["role"] == "user"][-1]
    assert "The tests failed (test_failure)" in feedback
    assert "test_add" in feedback
    assert run.events.filter(type="agent.feedback.sent").count() == 1
    assert PullRequest.objects.filter(task=submission.task).count() == 1
