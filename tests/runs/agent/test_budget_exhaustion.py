"""Each task budget, once spent, ends the run with its own reason code and an event."""

from __future__ import annotations

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

FINISH = {"tool_calls": [{"name": "finish", "arguments": {}}]}
BREAK = {
    "tool_calls": [
        {
            "name": "replace_text",
            "arguments": {"path": "calc/core.py", "old": "return a - b", "new": "return a - b + 1"},
        }
    ]
}
# Refused by policy: a retry. (Text not found is an answer the model acts on, not one.)
DENIED = {"tool_calls": [{"name": "write_file", "arguments": {"path": ".env", "content": "x"}}]}
SLOW = {
    "tool_calls": [
        {
            "name": "run_command",
            "arguments": {"command": "python3 -c \"__import__('time').sleep(1.5)\""},
        }
    ]
}

CASES = {
    "agent_attempts": (
        {"agent_attempts": 1},
        {"turns": [BREAK, FINISH]},
        "budget_agent_attempts",
        Run.Status.FAILED,
    ),
    "model_turns": ({"model_turns": 3}, demo.fix_script(), "budget_model_turns", Run.Status.FAILED),
    "tool_retries": (
        {"tool_retries": 1},
        {"turns": [DENIED, DENIED, FINISH]},
        "budget_tool_retries",
        Run.Status.FAILED,
    ),
    "wall_clock_seconds": (
        {"wall_clock_seconds": 1},
        {"turns": [SLOW, SLOW, FINISH]},
        "budget_wall_clock",
        Run.Status.TIMED_OUT,
    ),
    "cost_usd": ({"cost_usd": 0.000001}, demo.fix_script(), "budget_cost", Run.Status.FAILED),
}


@pytest.mark.parametrize("budget", list(CASES))
def test_budget_exhaustion_fails_with_its_reason(workspace, repository, budget):
    limits, script, reason, status = CASES[budget]
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        budget=limits,
        # The scripted model is free: the cost budget is spent by a priced copy of it.
        model_options={
            "provider": "scripted-priced" if budget == "cost_usd" else "scripted",
            "script": script,
        },
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert (run.status, run.failure_reason) == (status, reason), run.failure_detail
    exhausted = run.events.get(type="agent.budget.exhausted")
    assert exhausted.data["budget"] == budget
    assert exhausted.data["reason"] == reason
    assert run.events.filter(type=f"agent.run.{status}").count() == 1
    if budget == "model_turns":
        assert ModelTurn.objects.filter(run=run).count() == 3
