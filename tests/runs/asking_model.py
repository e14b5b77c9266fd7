"""A local model (Chat Completions) that plans, asks a person, fixes add() and finishes.

Which turn a request is for is read from the conversation it carries, as a model sees
it: the plan has no tools; each acting turn follows one more assistant message.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from runs.engine import run_drive_inline, step_execute
from runs.models import Run
from tests.runs.providers.test_provider_openai_chat import completion

QUESTION = "Which module owns the fix: calc/core.py or calc/util.py?"
PLAN = "1. Ask where the fix belongs. 2. Fix add(). 3. Finish."

ACTS: list[list[dict[str, Any]]] = [
    [
        {
            "id": "call_ask",
            "name": "ask_user",
            "arguments": {"question": QUESTION, "choices": ["calc/core.py", "calc/util.py"]},
        }
    ],
    [
        {
            "id": "call_fix",
            "name": "replace_text",
            "arguments": {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"},
        }
    ],
    [{"id": "call_done", "name": "finish", "arguments": {"summary": "fixed add()"}}],
]


def position(body: dict[str, Any]) -> str:
    if not body.get("tools"):
        return "plan"
    assistants = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return f"act-{assistants - 1}"  # the plan is the first assistant message


def responder(acts: list[list[dict[str, Any]]]) -> Any:
    """A ``respond`` for ChatCompletionsServer: the plan, then ``acts`` turn by turn."""

    def respond(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
        where = position(body)
        if where == "plan":
            return 200, {}, completion(PLAN)
        return 200, {}, completion(tool_calls=acts[int(where.split("-")[1])])

    return respond


respond = responder(ACTS)
# Without the question: what a run under plan review is told to do after its plan.
respond_without_asking = responder(ACTS[1:])


def asked(requests: list[dict[str, Any]]) -> Counter[str]:
    return Counter(position(r) for r in requests)


def tool_result(request: dict[str, Any], call_id: str) -> str:
    """The content the model was sent as the result of its call ``call_id``."""
    for message in request["messages"]:
        if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
            return str(message.get("content"))
    raise AssertionError(f"no result for {call_id} in {json.dumps(request)[:500]}")


def local_model(settings: Any, server: Any) -> None:
    """Point this process's model client at ``server`` (workers: the environment)."""
    settings.OPENAI_BASE_URL = server.base_url
    settings.OPENAI_API_KEY = "sk-local-test"


def drive(run: Run) -> Run:
    """Advance the run in this process as a worker would, its waiting step included (the
    step a wake-up after an answer, an expiry or a cancellation takes)."""
    current = Run.objects.get(pk=run.pk)
    step_execute(run_id=str(current.pk), step_no=current.step_no)
    return run_drive_inline(run_id=run.pk)
