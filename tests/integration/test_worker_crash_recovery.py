"""A worker SIGKILLed in the middle of a step: the run still completes, once."""

from __future__ import annotations

import pytest

from runs import demo
from runs.models import PullRequest, Run, ToolCall
from runs.reaper import zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def slow_fix_script() -> dict:
    """The demo fix with a 4-second command in the middle of the running step."""
    script = demo.fix_script()
    slow = {
        "content": "Thinking slowly.",
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {"command": "python3 -c \"__import__('time').sleep(4)\""},
            }
        ],
    }
    script["turns"].insert(2, slow)
    return script


def test_a_run_whose_worker_was_killed_completes_on_a_new_worker(
    workspace,
    repository,
    start_worker,
):
    first = start_worker("doomed")
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": slow_fix_script()},
    )
    run = submission.run

    def mid_running_step():
        run.refresh_from_db()
        return (
            run.status == Run.Status.RUNNING
            and run.lease_owner
            and run.model_turns.filter(purpose="act").count() >= 3
        )

    wait_for(mid_running_step, timeout=60, message="the slow command to start")
    first.kill()
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.lease_owner, "killed while holding the lease"

    start_worker("successor")
    # The lease (3 s in tests) expires with no heartbeat; the reaper recovers the run.
    wait_for(
        lambda: zombies_reap().recovered,
        timeout=30,
        interval=0.5,
        message="the reaper to recover the run",
    )

    def ended():
        run.refresh_from_db()
        return run.status in TERMINAL

    wait_for(ended, timeout=90, message="the run to end")
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert run.recoveries == 1
    types = list(run.events.values_list("type", flat=True))
    assert "agent.run.heartbeat.missed" in types and "agent.run.recovered" in types
    assert PullRequest.objects.filter(task=submission.task).count() == 1
    # Turns answered before the crash were not asked again: one row per (step, turn).
    assert ToolCall.objects.filter(run=run, tool="finish").count() == 1
    sequence = list(run.events.values_list("sequence_no", flat=True))
    assert sequence == list(range(1, len(sequence) + 1))
