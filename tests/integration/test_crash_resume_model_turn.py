"""A worker SIGKILLed right after a model turn was checkpointed: the run resumes on a new
worker without asking the model for that turn again, and opens exactly one PR."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from django.utils import timezone

from runs.models import ModelTurn, PullRequest, Run, ToolCall
from runs.reaper import zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer, completion

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ACTS: list[list[dict[str, Any]]] = [
    [
        {
            "id": "call_fix",
            "name": "replace_text",
            "arguments": {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"},
        }
    ],
    # The kill window: the answer is checkpointed, then this command runs for 4 s.
    [
        {
            "id": "call_slow",
            "name": "run_command",
            "arguments": {"command": "python3 -c \"__import__('time').sleep(4)\""},
        }
    ],
    [{"id": "call_done", "name": "finish", "arguments": {"summary": "fixed add()"}}],
]


def _position(body: dict[str, Any]) -> str:
    """Which turn a request asks for, from the conversation it carries (as a model sees it)."""
    if not body.get("tools"):
        return "plan"
    assistants = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return f"act-{assistants - 1}"  # the plan is the first assistant message


def _respond(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
    position = _position(body)
    if position == "plan":
        return 200, {}, completion("1. Fix add(). 2. Check. 3. Finish.")
    return 200, {}, completion(tool_calls=ACTS[int(position.split("-")[1])])


def test_killed_worker_resumes_without_re_requesting_the_checkpointed_turn(
    workspace,
    repository,
    start_worker,
    monkeypatch,
):
    with ChatCompletionsServer(_respond) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        doomed = start_worker("doomed")
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"provider": "openai:local-model"},
        )
        run = submission.run

        def slow_turn_checkpointed() -> bool:
            return (
                ModelTurn.objects.filter(run=run, purpose="act").count() == 2
                and ToolCall.objects.filter(run=run, call_id="call_slow", status="started").exists()
            )

        wait_for(slow_turn_checkpointed, timeout=60, message="the slow turn to be checkpointed")
        doomed.kill()
        asked_before_crash = Counter(_position(r) for r in server.requests)
        assert asked_before_crash == {"plan": 1, "act-0": 1, "act-1": 1}

        start_worker("rescuer")
        wait_for(
            lambda: Run.objects.filter(pk=run.pk, lease_until__lt=timezone.now()).exists(),
            timeout=15,
            message="the dead worker's lease to expire",
        )
        report = zombies_reap()
        assert report.recovered == 1

        def ended() -> Run | None:
            run.refresh_from_db()
            return run if run.status in TERMINAL else None

        wait_for(ended, timeout=90, message="the run to end")

        assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
        asked = Counter(_position(r) for r in server.requests)
        assert asked == {"plan": 1, "act-0": 1, "act-1": 1, "act-2": 1}, asked
        assert run.recoveries == 1
        assert ModelTurn.objects.filter(run=run).count() == 4
        assert PullRequest.objects.filter(task=submission.task).count() == 1
        assert run.events.filter(type="agent.pr.created").count() == 1
        assert run.events.filter(type="agent.model.turn.completed").count() == 4
        types = list(run.events.values_list("type", flat=True))
        assert "agent.run.heartbeat.missed" in types and "agent.run.recovered" in types
        slow = ToolCall.objects.get(run=run, call_id="call_slow")
        assert slow.status == "completed"
        # The conversation the model saw after recovery is the one it would have seen.
        last = server.requests[-1]
        assert [m["role"] for m in last["messages"]][-2:] == ["assistant", "tool"]
        assert json.dumps(last).count("call_slow") >= 2
        # Each request named its turn, and every checkpointed turn was asked exactly once.
        keys = Counter(h.get("idempotency-key") for h in server.headers)
        turns = ModelTurn.objects.filter(run=run).values_list("step_no", "turn_no")
        assert keys == Counter(f"{run.id}:{step}:{turn}" for step, turn in turns), keys
