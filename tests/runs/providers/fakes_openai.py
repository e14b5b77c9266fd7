"""The OpenAI-shaped fake servers: Chat Completions (JSON and SSE), an OpenAI-compatible
local server in the manner of vLLM, and the Responses API."""

from __future__ import annotations

import json
from typing import Any

from tests.runs.providers.fakes_base import REASONING_MODEL, Refusal, Seen, Turn, openai_error, sse


class OpenAIChat:
    """POST /v1/chat/completions."""

    reasoning_field = ""

    def seen(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seen:
        messages = body.get("messages", [])
        return Seen(
            path,
            body,
            headers,
            "act" if body.get("tools") else "plan",
            sum(1 for m in messages if m.get("role") == "tool"),
            json.dumps(body),
        )

    def refuse(self, seen: Seen) -> Refusal | None:
        body = seen.body
        if REASONING_MODEL.search(str(body.get("model", ""))):
            if "max_tokens" in body:
                return Refusal(
                    400,
                    openai_error(
                        "Unsupported parameter: 'max_tokens' is not supported with this "
                        "model. Use 'max_completion_tokens' instead.",
                        param="max_tokens",
                        code="unsupported_parameter",
                    ),
                )
            if body.get("temperature", 1) != 1:
                return Refusal(
                    400,
                    openai_error(
                        f"Unsupported value: 'temperature' does not support "
                        f"{body['temperature']} with this model. Only the default (1) "
                        "value is supported.",
                        param="temperature",
                        code="unsupported_value",
                    ),
                )
        return None

    def _message(self, turn: Turn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for call_id, name, arguments in turn.calls
            ]
        if turn.reasoning and self.reasoning_field:
            message[self.reasoning_field] = turn.reasoning
        return message

    def _usage(self, turn: Turn) -> dict[str, Any]:
        tokens_in, tokens_out, cached = turn.usage
        return {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def render(self, turn: Turn, seen: Seen, model: str) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": self._message(turn),
                    "finish_reason": "tool_calls" if turn.calls else "stop",
                }
            ],
            "usage": self._usage(turn),
        }

    def stream(self, turn: Turn, seen: Seen, model: str) -> list[bytes]:
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, dict]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return "", {**head, "choices": [choice]}

        events = [chunk({"role": "assistant", "content": ""})]
        if turn.reasoning and self.reasoning_field:
            events.append(chunk({self.reasoning_field: turn.reasoning}))
        for start in range(0, len(turn.text), 8):
            events.append(chunk({"content": turn.text[start : start + 8]}))
        for index, (call_id, name, arguments) in enumerate(turn.calls):
            raw = json.dumps(arguments)
            first = {"index": index, "id": call_id, "type": "function"}
            first["function"] = {"name": name, "arguments": ""}
            events.append(chunk({"tool_calls": [first]}))
            for start in range(0, len(raw), 10):
                part = {"index": index, "function": {"arguments": raw[start : start + 10]}}
                events.append(chunk({"tool_calls": [part]}))
        events.append(chunk({}, "tool_calls" if turn.calls else "stop"))
        if (seen.body.get("stream_options") or {}).get("include_usage"):
            events.append(("", {**head, "choices": [], "usage": self._usage(turn)}))
        return sse(events, done=True)


class LocalOpenAICompatible(OpenAIChat):
    """vLLM with a reasoning parser (and the llama.cpp server): ``reasoning_content``."""

    reasoning_field = "reasoning_content"


class OpenAIResponses:
    """POST /v1/responses."""

    def seen(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seen:
        items = body.get("input", [])
        return Seen(
            path,
            body,
            headers,
            "act" if body.get("tools") else "plan",
            sum(1 for i in items if i.get("type") == "function_call_output"),
            json.dumps(body),
        )

    def refuse(self, seen: Seen) -> Refusal | None:
        body = seen.body
        if REASONING_MODEL.search(str(body.get("model", ""))) and "temperature" in body:
            return Refusal(
                400,
                openai_error(
                    "Unsupported parameter: 'temperature' is not supported with this model.",
                    param="temperature",
                    code="unsupported_parameter",
                ),
            )
        calls = {i["call_id"] for i in body.get("input", []) if i.get("type") == "function_call"}
        for item in body.get("input", []):
            if item.get("type") == "function_call_output" and item["call_id"] not in calls:
                return Refusal(
                    400,
                    openai_error(
                        f"No tool call found for function call output with call_id "
                        f"{item['call_id']}.",
                        param="input",
                    ),
                )
        return None

    def render(self, turn: Turn, seen: Seen, model: str) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if turn.reasoning:
            summary = [{"type": "summary_text", "text": turn.reasoning}]
            output.append({"type": "reasoning", "id": "rs_1", "summary": summary})
        if turn.text:
            output.append(
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
                }
            )
        for call_id, name, arguments in turn.calls:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call_id}",
                    "call_id": call_id,
                    "name": name,
                    "arguments": json.dumps(arguments),
                    "status": "completed",
                }
            )
        tokens_in, tokens_out, cached = turn.usage
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens_details": {"reasoning_tokens": len(turn.reasoning) // 4},
            },
        }

    def stream(self, turn: Turn, seen: Seen, model: str) -> list[bytes]:
        raise NotImplementedError("the Responses fake answers without streaming")
