"""A run against a Chat Completions server, exported and replayed by the scripted provider."""

from __future__ import annotations

import copy
import io
import json

import pytest
from django.core.management import call_command

from runs.agent.transcript import transcript_export
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run, ToolCall
from runs.services import task_submit
from tests.runs.agent.test_agent_awkward_model import awkward_profile

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    """Runs are driven in this process; no wake-up may reach a worker elsewhere."""
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


@pytest.fixture
def awkward_server(settings):
    with awkward_profile(settings) as server:
        yield server


def _recorded_run(workspace, repository) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": "awkward"},
    )
    run = run_drive_inline(run_id=submission.run.id)
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    return run


def _replay(workspace, repository, script: dict) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )
    return run_drive_inline(run_id=submission.run.id)


def _calls(run: Run) -> list[tuple[str, str, str]]:
    return list(
        ToolCall.objects.filter(run=run)
        .order_by("step_no", "turn_no", "id")
        .values_list("call_id", "tool", "status")
    )


def test_an_exported_run_replays_with_zero_divergence_and_the_same_patch(
    workspace, repository, awkward_server
):
    original = _recorded_run(workspace, repository)

    out = io.StringIO()
    call_command("run_transcript", str(original.id), stdout=out)
    transcript = json.loads(out.getvalue())
    assert transcript == json.loads(json.dumps(transcript_export(original)))
    replay = _replay(workspace, repository, transcript["script"])

    assert replay.status == Run.Status.COMPLETED, (replay.failure_reason, replay.failure_detail)
    assert replay.patches.get().diff_sha256 == original.patches.get().diff_sha256
    assert _calls(replay) == _calls(original)
    assert ModelTurn.objects.filter(run=replay).count() == len(transcript["script"]["turns"]) + 1
    # The context refusal was played again, so the condensed request was sent again.
    assert replay.events.filter(
        type="agent.context.condensed", data__reason="context_length_exceeded"
    ).exists()
    assert [t.problem for t in ModelTurn.objects.filter(run=replay).exclude(problem="")] == [
        t.problem for t in ModelTurn.objects.filter(run=original).exclude(problem="")
    ]


def test_the_first_divergence_is_reported(workspace, repository, awkward_server):
    original = _recorded_run(workspace, repository)
    script = copy.deepcopy(transcript_export(original)["script"])
    # The recording says the second acting turn was asked after a different tool answer.
    second = script["turns"][1]["request"]["messages"]
    tool_message = next(m for m in reversed(second) if m["role"] == "tool")
    tool_message["content"] = "something the original run never saw"

    replay = _replay(workspace, repository, script)

    assert (replay.status, replay.failure_reason) == (Run.Status.FAILED, "replay_diverged")
    assert "act turn 2" in replay.failure_detail
    assert "differs in 'content'" in replay.failure_detail
    assert "something the original run never saw" in replay.failure_detail
