"""Record and replay: a finished run as a script the scripted provider plays back.

The export holds, for every model turn of the run in order, the answer the model gave
(text, tool calls exactly as received, finish reason) and the request it answered.
Replayed through the scripted provider, each request the new run sends is compared
with the recorded one; the first difference stops the run with ``replay_diverged``
and says where it is. Numbers are masked in that comparison (a test runner's "Ran 2
tests in 0.004s" differs run to run); everything else must match exactly, so a replay
that completes has sent what the original sent and got the same answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runs.models import ModelTurn, Run

FORMAT = "agentplatform.transcript/1"
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _request_of(turn: ModelTurn) -> dict[str, Any]:
    if turn.request_artifact is None:
        return {}
    try:
        data = json.loads(turn.request_artifact.content)
    except ValueError:
        return {}
    return {"messages": data.get("messages", []), "tools": data.get("tools", [])}


def transcript_export(run: Run) -> dict[str, Any]:
    """The run's model turns as a script with the requests they answered."""
    refused = {
        (e.data.get("turn_no"))
        for e in run.events.filter(
            type="agent.context.condensed", data__reason="context_length_exceeded"
        )
    }
    turns = ModelTurn.objects.filter(run=run).select_related("request_artifact")
    script: dict[str, Any] = {"turns": []}
    for turn in turns.order_by("step_no", "turn_no"):
        answer = dict(turn.response)
        recorded = {
            "content": answer.get("content", ""),
            "tool_calls": answer.get("tool_calls", []),
            "finish_reason": answer.get("finish_reason", ""),
            "request": _request_of(turn),
        }
        if turn.purpose == "plan":
            script["plan"] = recorded
        elif turn.purpose == "judge":
            script["judge"] = recorded
        else:
            if turn.turn_no in refused:
                recorded["context_refused"] = True
            script["turns"].append(recorded)
    return {
        "format": FORMAT,
        "run_id": str(run.id),
        "model_profile": run.model_profile,
        "status": run.status,
        "script": {**script, "replay": True},
    }


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return NUMBER.sub("N", value)
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    return value


def request_divergence(recorded: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """Where ``messages`` first differs from the recorded request, or "" if nowhere."""
    expected = recorded.get("messages")
    if expected is None:
        return ""
    for index, (want, got) in enumerate(zip(expected, messages, strict=False)):
        want_m, got_m = _masked(want), _masked(got)
        if want_m == got_m:
            continue
        for key in sorted(set(want_m) | set(got_m)):
            if want_m.get(key) != got_m.get(key):
                return (
                    f"message {index} ({want.get('role')}) differs in {key!r}: recorded "
                    f"{json.dumps(want.get(key))[:200]}, sent {json.dumps(got.get(key))[:200]}"
                )
    if len(expected) != len(messages):
        return f"recorded {len(expected)} messages, sent {len(messages)}"
    return ""
