"""The scripted agent served as a model endpoint: OpenAI Chat Completions over HTTP.

The platform reaches it through its openai provider, as it would reach vLLM or a hosted
model, so a turn asked again shows up here, at the endpoint, and not only in the
database. Every request is logged with the turn key the provider sends
(``Idempotency-Key: run:step:turn``) and the moment it arrived.

The answer is chosen from the conversation, as a model would see it: no tools offered is
the plan (or, when it carries a patch, the judge); otherwise the number of assistant
turns with tool calls so far says which act turn of the script comes next.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.chaos.httpserver import HarnessHTTPServer
from tests.chaos.services import free_port

PROFILE = "chaos-model"


@dataclass(frozen=True)
class ModelRequest:
    key: str  # run:step:turn, "" when the request named none
    at: float  # epoch seconds, when it arrived
    position: str  # plan, judge, act-N


def position_of(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    if not body.get("tools"):
        last = str((messages[-1] if messages else {}).get("content") or "")
        return "judge" if "\nPatch:\n" in last else "plan"
    acted = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    return f"act-{acted}"


def _tokens(payload: Any) -> int:
    return max(1, len(json.dumps(payload, default=str)) // 4)


class ScriptedModelServer:
    def __init__(self, script: dict[str, Any], *, latency: float = 0.0) -> None:
        self.script = script
        # Seconds each answer takes, as a hosted model's turn does; the requests being
        # answered at once (``in_flight``, its ``peak``) are the runs waiting on the model.
        self.latency = latency
        self.in_flight = 0
        self.peak = 0
        self.port = free_port()
        self.lock = threading.Lock()
        self.log: list[ModelRequest] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                position = position_of(body)
                with server.lock:
                    server.log.append(
                        ModelRequest(
                            self.headers.get("Idempotency-Key") or "", time.time(), position
                        )
                    )
                with server.lock:
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                try:
                    if server.latency:
                        time.sleep(server.latency)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                payload = json.dumps(server.reply(body, position)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HarnessHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def profile(self) -> dict[str, Any]:
        """The MODEL_PROFILES entry that points the platform here."""
        return {
            "provider": "openai",
            "model": "chaos-scripted",
            "base_url": self.base_url,
            "context_window": 32_768,
            "max_output_tokens": 4_096,
            "prices_per_million": {"input": "0.50", "output": "1.50"},
        }

    def requests(self) -> list[ModelRequest]:
        with self.lock:
            return list(self.log)

    def reply(self, body: dict[str, Any], position: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if position == "plan":
            message["content"] = self.script.get("plan", "Make the change, run the tests.")
        elif position == "judge":
            message["content"] = json.dumps(
                self.script.get("judge", {"verdict": "accept", "score": 1.0})
            )
        else:
            index = int(position.split("-")[1])
            turns = self.script.get("turns", [])
            turn = (
                turns[index]
                if index < len(turns)
                else {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]}
            )
            message["content"] = turn.get("content") or None
            message["tool_calls"] = [
                {
                    "id": call.get("id") or f"call-{index}-{n}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call.get("arguments", {})),
                    },
                }
                for n, call in enumerate(turn.get("tool_calls", []))
            ]
        prompt, completion = _tokens(body.get("messages")), _tokens(message)
        return {
            "id": f"chatcmpl-chaos-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "chaos-scripted",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
