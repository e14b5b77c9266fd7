"""Run replay: a finished run reproduced without its model, divergences reported."""

from __future__ import annotations

import pytest

from jobs.models import OutboxEvent
from runs.agent.sandbox import sandbox_orphans_sweep
from runs.models import RunReplay
from runs.replay.reproduce import replay_execute, replay_request
from tests.runs.replay.recorded import model_server, push_change, recorded_run
from tests.runs.test_event_contracts import _assert_contract

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def test_a_completed_run_replays_to_the_same_patch_with_no_model_request(
    settings, workspace, repository
):
    with model_server(settings, "counted") as server:
        original = recorded_run(workspace, repository, "counted")
        asked = len(server.requests)

        replay = replay_execute(replay_id=str(replay_request(run=original, by="t").id))

        assert len(server.requests) == asked  # not one request more
    assert replay.status == RunReplay.Status.REPRODUCED, replay.divergences
    assert replay.report["patch_sha256"] == original.patches.get().diff_sha256
    assert replay.report["tool_calls"] == 4
    assert replay.report["tests"]["outcome"] == "passed"
    event = original.events.get(type="agent.run.replayed")
    _assert_contract(OutboxEvent.objects.get(event_id=event.id).payload)
    assert event.data == {
        "replay_id": str(replay.id),
        "outcome": "reproduced",
        "divergences": 0,
        "first_divergence": "",
    }


def test_a_run_whose_repository_changed_since_reports_the_divergence(
    settings, workspace, repository, sample_repo, tmp_path
):
    with model_server(settings, "counted"):
        original = recorded_run(workspace, repository, "counted")
    push_change(
        sample_repo,
        tmp_path,
        "calc/core.py",
        "def add(a, b):\n    return sum((a, b))\n\n\ndef multiply(a, b):\n    return a * b\n",
    )

    replay = replay_execute(replay_id=str(replay_request(run=original, by="t").id))

    assert replay.status == RunReplay.Status.DIVERGED
    kinds = [d["kind"] for d in replay.divergences]
    assert kinds == ["patch_no_longer_applies"], replay.divergences
    # At its base commit the run still reproduces exactly.
    assert replay.report["patch_sha256"] == original.patches.get().diff_sha256
    assert replay.report["head"]["moved"] and replay.report["head"]["applies"] is False


def test_a_test_that_now_fails_on_the_branch_is_reported(
    settings, workspace, repository, sample_repo, tmp_path
):
    with model_server(settings, "counted"):
        original = recorded_run(workspace, repository, "counted")
    # The patch still applies (another file), but the branch now expects more of add().
    push_change(
        sample_repo,
        tmp_path,
        "tests/test_more.py",
        "import unittest\n\nfrom calc import add\n\n\n"
        "class MoreTest(unittest.TestCase):\n"
        "    def test_add_three(self):\n"
        "        self.assertEqual(add(1, 2, 3), 6)\n",
    )

    replay = replay_execute(replay_id=str(replay_request(run=original, by="t").id))

    assert [d["kind"] for d in replay.divergences] == ["tests_fail_on_branch"]
    assert replay.divergences[0]["recorded"] == "passed"
    assert replay.report["head"]["applies"] is True


def test_a_tool_result_that_differs_today_is_reported(settings, workspace, repository):
    with model_server(settings, "counted"):
        original = recorded_run(workspace, repository, "counted")
    # The repository's policy no longer lets the agent run python3.
    repository.allowed_commands = ["git", "ls"]
    repository.save()

    replay = replay_execute(replay_id=str(replay_request(run=original, by="t").id))

    assert replay.status == RunReplay.Status.DIVERGED
    denied = [d for d in replay.divergences if d["kind"] == "tool_denied_now"]
    assert [d["tool"] for d in denied] == ["run_command"]
    assert denied[0]["turn_no"] >= 1 and denied[0]["call_id"] == "c3"


def test_the_sandbox_orphan_sweep_leaves_a_replay_in_flight_alone(settings, workspace, repository):
    with model_server(settings, "counted"):
        original = recorded_run(workspace, repository, "counted")
    swept: list[list[str]] = []

    def sweep_while_replaying(done: int, total: int, what: str) -> None:
        if done == 1:
            swept.append(sandbox_orphans_sweep(active_run_ids=set(), min_age_seconds=0))

    replay = replay_execute(
        replay_id=str(replay_request(run=original, by="t").id), progress=sweep_while_replaying
    )

    assert swept and not any(name.startswith("replay-") for name in swept[0])
    assert replay.status == RunReplay.Status.REPRODUCED, replay.divergences


def test_a_replay_whose_repository_is_gone_ends_errored(
    settings, workspace, repository, sample_repo
):
    with model_server(settings, "counted"):
        original = recorded_run(workspace, repository, "counted")
    sample_repo.rename(sample_repo.with_name("moved.git"))

    replay = replay_execute(replay_id=str(replay_request(run=original, by="t").id))

    assert replay.status == RunReplay.Status.ERRORED
    assert [d["kind"] for d in replay.divergences] == ["replay_errored"]
    assert original.events.get(type="agent.run.replayed").data["outcome"] == "errored"
