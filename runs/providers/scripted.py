"""The scripted model: replays a JSON transcript, for the demo and for tests.

A script is ``{"plan": "...", "turns": [{"content": "...", "tool_calls": [...]}, ...],
"judge": {"verdict": "accept", "score": 0.9}}``. Turn N of the run gets turn N of the
script, so a recovered run that re-asks a turn gets the same answer a real model would
have been asked for; once the script is exhausted the model finishes. A follow-up run
(run N > 1) plays ``"followups": {"N": {...}}`` instead when the script has one.

An exported run (see runs.agent.transcript) is a script with ``"replay": true``: each
turn carries the request it answered, every request is checked against it, and the
first difference raises ReplayDiverged naming it. A turn the endpoint refused for
length is refused again until the condensed request arrives.
"""

from __future__ import annotations

import json
from typing import Any

from runs.agent.transcript import request_divergence
from runs.providers.base import (
    ContextLengthExceeded,
    ModelProvider,
    ModelReply,
    ModelUsage,
    ReplayDiverged,
    ToolCallRequest,
)


def _estimate_tokens(payload: Any) -> int:
    return max(1, len(json.dumps(payload, default=str)) // 4)


class ScriptedProvider(ModelProvider):
    name = "scripted"

    def __init__(self, script: dict[str, Any] | None, *, run_no: int = 1) -> None:
        script = script or {}
        followup = (script.get("followups") or {}).get(str(run_no))
        self.script = {**script, **followup} if followup else script
        self.model = "scripted-1"

    def complete(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: str,
        turn_index: int,
    ) -> ModelReply:
        tokens_in = _estimate_tokens(messages)
        if self.script.get("replay"):
            return self._replay(messages, purpose, turn_index, tokens_in)
        if purpose == "plan":
            content = self.script.get("plan", "Read the code, make the change, run the tests.")
            return ModelReply(
                content=content,
                usage=ModelUsage(tokens_in, _estimate_tokens(content)),
                model=self.model,
            )
        if purpose == "judge":
            verdict = self.script.get("judge", {"verdict": "accept", "score": 1.0})
            content = json.dumps(verdict)
            return ModelReply(
                content=content,
                usage=ModelUsage(tokens_in, _estimate_tokens(content)),
                model=self.model,
            )
        turns = self.script.get("turns", [])
        if turn_index >= len(turns):
            call = ToolCallRequest(
                id=f"call-{turn_index}-finish", name="finish", arguments={"summary": "done"}
            )
            return ModelReply(
                content="", tool_calls=[call], usage=ModelUsage(tokens_in, 8), model=self.model
            )
        turn = turns[turn_index]
        calls = [
            ToolCallRequest(
                id=call.get("id") or f"call-{turn_index}-{position}",
                name=call["name"],
                arguments=call.get("arguments", {}),
            )
            for position, call in enumerate(turn.get("tool_calls", []))
        ]
        return ModelReply(
            content=turn.get("content", ""),
            tool_calls=calls,
            usage=ModelUsage(tokens_in, _estimate_tokens(turn)),
            model=self.model,
        )

    def _replay(
        self, messages: list[dict[str, Any]], purpose: str, turn_index: int, tokens_in: int
    ) -> ModelReply:
        if purpose in ("plan", "judge"):
            recorded = self.script.get(purpose)
            where = purpose
        else:
            turns = self.script.get("turns", [])
            recorded = turns[turn_index] if turn_index < len(turns) else None
            where = f"act turn {turn_index + 1}"
        if not isinstance(recorded, dict):
            raise ReplayDiverged(f"replay diverged at {where}: the recording has no such turn")
        divergence = request_divergence(recorded.get("request") or {}, messages)
        if divergence and recorded.get("context_refused"):
            raise ContextLengthExceeded("recorded: the endpoint refused this request for length")
        if divergence:
            raise ReplayDiverged(f"replay diverged at {where}: {divergence}")
        calls = [
            ToolCallRequest(
                id=call["id"],
                name=call["name"],
                arguments=call.get("arguments", {}),
                error=call.get("error", ""),
                raw_arguments=call.get("raw_arguments", ""),
            )
            for call in recorded.get("tool_calls", [])
        ]
        content = recorded.get("content", "")
        return ModelReply(
            content=content,
            tool_calls=calls,
            usage=ModelUsage(tokens_in, _estimate_tokens(recorded.get("tool_calls")) + 1),
            model=self.model,
            finish_reason=recorded.get("finish_reason", ""),
        )
