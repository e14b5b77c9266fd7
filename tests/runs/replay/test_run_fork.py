"""Fork: a new run reuses the recorded model turns up to N and asks the model after."""

from __future__ import annotations

import pytest

from jobs.models import OutboxEvent
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run, Task
from runs.replay.fork import run_fork
from runs.services import CommandRefused
from tests.factories import RunFactory
from tests.runs.replay.recorded import model_server, recorded_run
from tests.runs.test_event_contracts import _assert_contract

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def test_a_fork_from_turn_n_asks_the_other_model_only_after_n(settings, workspace, repository):
    with (
        model_server(settings, "counted") as first,
        model_server(settings, "other", offset=2) as other,
    ):
        original = recorded_run(workspace, repository, "counted")
        recorded_turns = ModelTurn.objects.filter(run=original).count()
        asked_first = len(first.requests)

        fork = run_fork(run=original, turn=2, profile="other", by="t")
        fork = run_drive_inline(run_id=fork.id)

        assert fork.status == Run.Status.COMPLETED, (fork.failure_reason, fork.failure_detail)
        assert len(first.requests) == asked_first  # nothing re-asked of the recorded model
        assert len(other.requests) == recorded_turns - 2  # only the turns after N
    assert fork.patches.get().diff_sha256 == original.patches.get().diff_sha256
    assert fork.task_id != original.task_id
    assert fork.task.execution_mode == Task.Mode.DRY_RUN
    assert fork.task.source_ref["fork_of"] == {
        "run_id": str(original.id),
        "task_id": str(original.task_id),
        "turn": 2,
    }
    on_original = original.events.get(type="agent.run.forked").data
    on_fork = fork.events.get(type="agent.run.forked").data
    assert on_original == on_fork and on_fork["fork_run_id"] == str(fork.id)
    for event in OutboxEvent.objects.filter(type="agent.run.forked"):
        _assert_contract(event.payload)
    # The reused turns cost the fork nothing; what it asked, it paid for.
    assert fork.tokens_in == sum(
        t.tokens_in for t in ModelTurn.objects.filter(run=fork).order_by("step_no", "turn_no")[2:]
    )


@pytest.mark.parametrize(
    ("fields", "turn", "profile", "code"),
    [
        ({"status": Run.Status.RUNNING}, 0, "", "run_active"),
        ({"status": Run.Status.COMPLETED, "feedback": "rename it"}, 0, "", "run_followup"),
        ({"status": Run.Status.COMPLETED}, 0, "no-such-profile", "model_profile_unknown"),
        ({"status": Run.Status.COMPLETED}, 1, "", "turn_out_of_range"),
    ],
)
def test_a_fork_that_cannot_start_as_asked_is_refused(fields, turn, profile, code):
    run = RunFactory(**fields)

    with pytest.raises(CommandRefused) as refused:
        run_fork(run=run, turn=turn, profile=profile, by="t")

    assert refused.value.code == code
    assert Task.objects.count() == 1  # nothing was submitted
