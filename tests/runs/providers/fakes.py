"""Local model servers that speak each protocol as the real endpoints do.

One server per protocol: OpenAI Chat Completions (JSON and SSE), the OpenAI Responses
API, Anthropic Messages (JSON and SSE), Gemini generateContent, and an OpenAI-compatible
local server in the manner of vLLM (which returns ``reasoning_content``). Each checks
what the real one checks and refuses as it does, with its error body:

- OpenAI reasoning models (o-series, gpt-5) refuse ``max_tokens`` and any ``temperature``
  but the default;
- Anthropic requires ``max_tokens``, ``x-api-key`` and ``anthropic-version``, refuses a
  ``tool_use`` not answered by a ``tool_result`` in the next message, and (as its newer
  models do) a conversation that ends with an assistant message (a prefill);
- Gemini refuses a role other than ``user`` and ``model``.

What to answer is decided by a script from a protocol-neutral view of the request
(``Seen``): its purpose (plan: no tools offered; act) and how many tool results it
carries, so the same script plays on every protocol.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.runs.providers.fakes_base import Refusal, Script, Seen, Turn, sse
from tests.runs.providers.fakes_openai import LocalOpenAICompatible, OpenAIChat, OpenAIResponses

__all__ = ["FIX_ACTS", "ModelServer", "Refusal", "Seen", "Turn", "fix_script"]


class AnthropicMessages:
    """POST /v1/messages."""

    def seen(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seen:
        messages = body.get("messages", [])
        results = sum(
            1
            for m in messages
            if isinstance(m.get("content"), list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        )
        real_tools = [t for t in body.get("tools", []) if t.get("name") != "dummy_tool"]
        purpose = "act" if real_tools else "plan"
        return Seen(path, body, headers, purpose, results, json.dumps(body))

    @staticmethod
    def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def refuse(self, seen: Seen) -> Refusal | None:
        body, headers = seen.body, seen.headers
        if not headers.get("x-api-key"):
            return Refusal(401, self._error("x-api-key header is required", "authentication_error"))
        if not headers.get("anthropic-version"):
            return Refusal(400, self._error("anthropic-version: header is required"))
        if "max_tokens" not in body:
            return Refusal(400, self._error("max_tokens: Field required"))
        messages = body.get("messages", [])
        if messages and messages[-1].get("role") == "assistant":
            return Refusal(
                400,
                self._error(
                    "This model does not support assistant message prefill. The "
                    "conversation must end with a user message."
                ),
            )
        for position, message in enumerate(messages):
            blocks = message.get("content") if isinstance(message.get("content"), list) else []
            asked = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            if not asked:
                continue
            following = messages[position + 1] if position + 1 < len(messages) else {}
            answered = {
                b.get("tool_use_id")
                for b in following.get("content") or []
                if isinstance(b, dict) and b.get("type") == "tool_result"
            }
            if set(asked) - answered:
                return Refusal(
                    400,
                    self._error(
                        f"messages.{position + 1}: `tool_use` ids were found without "
                        f"`tool_result` blocks immediately after: {', '.join(asked)}. Each "
                        "`tool_use` block must have a corresponding `tool_result` block in "
                        "the next message."
                    ),
                )
        return None

    def _content(self, turn: Turn) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        for call_id, name, arguments in turn.calls:
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        return content

    def render(self, turn: Turn, seen: Seen, model: str) -> dict[str, Any]:
        tokens_in, tokens_out, cached = turn.usage
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": self._content(turn),
            "stop_reason": "tool_use" if turn.calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": tokens_in - cached,
                "output_tokens": tokens_out,
                "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0,
            },
        }

    def stream(self, turn: Turn, seen: Seen, model: str) -> list[bytes]:
        tokens_in, tokens_out, cached = turn.usage
        start = self.render(Turn(usage=(tokens_in, 1, cached)), seen, model)
        start.update(content=[], stop_reason=None)
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for index, block in enumerate(self._content(turn)):
            if block["type"] == "text":
                opened = {"type": "text", "text": ""}
                parts = [block["text"][i : i + 8] for i in range(0, len(block["text"]), 8)]
                deltas = [{"type": "text_delta", "text": part} for part in parts]
            else:
                opened = {**block, "input": {}}
                raw = json.dumps(block["input"])
                parts = [raw[i : i + 10] for i in range(0, len(raw), 10)]
                deltas = [{"type": "input_json_delta", "partial_json": part} for part in parts]
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opened},
                )
            )
            for delta in deltas:
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        stop = {"stop_reason": "tool_use" if turn.calls else "end_turn", "stop_sequence": None}
        events.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": stop, "usage": {"output_tokens": tokens_out}},
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return sse(events)


class GeminiGenerateContent:
    """POST /v1beta/models/<model>:generateContent."""

    def seen(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seen:
        contents = body.get("contents", [])
        results = sum(
            1
            for c in contents
            for part in c.get("parts", [])
            if "function_response" in part or "functionResponse" in part
        )
        purpose = "act" if body.get("tools") else "plan"
        return Seen(path, body, headers, purpose, results, json.dumps(body))

    def refuse(self, seen: Seen) -> Refusal | None:
        for position, content in enumerate(seen.body.get("contents", [])):
            if content.get("role") not in ("user", "model"):
                message = (
                    f"* GenerateContentRequest.contents[{position}].role: "
                    "Please use a valid role: user, model."
                )
                return Refusal(
                    400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
                )
        return None

    def render(self, turn: Turn, seen: Seen, model: str) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if turn.text:
            parts.append({"text": turn.text})
        for _, name, arguments in turn.calls:
            parts.append({"functionCall": {"name": name, "args": arguments}})
        tokens_in, tokens_out, cached = turn.usage
        return {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": tokens_in,
                "candidatesTokenCount": tokens_out,
                "totalTokenCount": tokens_in + tokens_out,
                "cachedContentTokenCount": cached,
            },
            "modelVersion": model,
        }

    def stream(self, turn: Turn, seen: Seen, model: str) -> list[bytes]:
        raise NotImplementedError("the Gemini fake answers without streaming")


PROTOCOLS = {
    "openai": OpenAIChat,
    "local": LocalOpenAICompatible,
    "openai-responses": OpenAIResponses,
    "anthropic": AnthropicMessages,
    "gemini": GeminiGenerateContent,
}


class ModelServer:
    """A protocol's endpoint in a thread; ``script(seen, n)`` decides each answer.

    ``chunk_delay`` spaces a streamed reply's events, as a slow model does.
    """

    def __init__(
        self, kind: str, script: Script, *, model: str = "", chunk_delay: float = 0.0
    ) -> None:
        self.kind = kind
        self.protocol = PROTOCOLS[kind]()
        self.script = script
        self.model = model or "model-x"
        self.chunk_delay = chunk_delay
        self.seen: list[Seen] = []
        self.refused: list[Refusal] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen = server.protocol.seen(self.path, body, headers)
                with server._lock:
                    server.seen.append(seen)
                    number = len(server.seen)
                answer = server.protocol.refuse(seen) or server.script(seen, number)
                if isinstance(answer, Refusal):
                    server.refused.append(answer)
                    self._send(answer.status, json.dumps(answer.body).encode(), answer.headers)
                elif isinstance(answer, bytes):
                    self._send(200, answer, {})
                elif body.get("stream") or ":streamGenerateContent" in self.path:
                    self._stream(server.protocol.stream(answer, seen, server.model))
                else:
                    reply = server.protocol.render(answer, seen, server.model)
                    self._send(200, json.dumps(reply).encode(), {})

            def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _stream(self, events: list[bytes]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                for event in events:
                    self.wfile.write(event)
                    self.wfile.flush()
                    time.sleep(server.chunk_delay)
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The base URL a profile names for this protocol."""
        if self.kind == "anthropic":
            return self.root
        if self.kind == "gemini":
            return f"{self.root}/v1beta"
        return f"{self.root}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [s.body for s in self.seen]

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def fix_script(acts: list[list[tuple[str, str, dict[str, Any]]]]) -> Script:
    """Plan in text, then act turn k answers with ``acts[k]`` (k = tool results so far)."""

    def script(seen: Seen, n: int) -> Turn:
        if "You review a patch" in seen.text:
            return Turn(text='{"verdict": "accept", "score": 0.9, "reasons": "fixes add()"}')
        if seen.purpose == "plan":
            return Turn(text="1. Fix add(). 2. Run the tests. 3. Finish.", usage=(300, 12, 0))
        position = min(seen.tool_results, len(acts) - 1)
        return Turn(calls=acts[position], usage=(900 + 100 * position, 30, 600))

    return script


FIX_ACTS: list[list[tuple[str, str, dict[str, Any]]]] = [
    [
        (
            "call_fix",
            "replace_text",
            {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"},
        )
    ],
    [("call_test", "run_command", {"command": "python3 -m unittest -q"})],
    [("call_done", "finish", {"summary": "add() fixed"})],
]
