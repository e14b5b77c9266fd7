"""The openai provider against a local server that speaks Chat Completions with tools."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runs.agent.tools import TOOL_SCHEMAS
from runs.providers import provider_for
from runs.providers.base import ModelError
from runs.providers.openai_chat import OpenAIChatProvider

pytestmark = pytest.mark.no_services

Reply = tuple[int, dict[str, str], bytes]


class ChatCompletionsServer:
    """A Chat Completions endpoint in a thread; ``respond`` decides each answer."""

    def __init__(self, respond: Callable[[dict[str, Any], int], Reply]) -> None:
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, **body})
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    number = len(server.requests)
                status, headers, payload = server.respond(body, number)
                self.send_response(status)
                for key, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatCompletionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(
    content: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "gpt-4o-mini",
    tokens: tuple[int, int] = (120, 30),
) -> bytes:
    """A Chat Completions response body as a real server sends it."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call.get("id", f"call_{n}"),
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
            for n, call in enumerate(tool_calls)
        ]
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": tokens[0],
                "completion_tokens": tokens[1],
                "total_tokens": sum(tokens),
            },
        }
    ).encode()


@pytest.fixture
def chat_server() -> Iterator[Callable[..., ChatCompletionsServer]]:
    servers: list[ChatCompletionsServer] = []

    def start(respond: Callable[[dict[str, Any], int], Reply]) -> ChatCompletionsServer:
        server = ChatCompletionsServer(respond).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


def _provider(server: ChatCompletionsServer, **kwargs: Any) -> OpenAIChatProvider:
    return OpenAIChatProvider(
        "gpt-4o-mini",
        base_url=server.base_url,
        api_key="sk-test-key",
        backoff_seconds=0.01,
        timeout=5,
        **kwargs,
    )


MESSAGES = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "Fix add()."},
    {"role": "assistant", "content": "Reading.", "tool_calls": []},
]


def test_tool_calls_and_usage_are_parsed(chat_server):
    server = chat_server(
        lambda body, n: (
            200,
            {},
            completion(
                "Let me read it.",
                [{"id": "call_a", "name": "read_file", "arguments": {"path": "calc/core.py"}}],
            ),
        )
    )

    reply = _provider(server).complete(
        messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
    )

    assert reply.content == "Let me read it."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_a", "read_file", {"path": "calc/core.py"})
    ]
    assert (reply.usage.tokens_in, reply.usage.tokens_out) == (120, 30)
    sent = server.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["model"] == "gpt-4o-mini"
    assert {t["function"]["name"] for t in sent["tools"]} >= {"read_file", "finish"}
    # An empty tool_calls list is not valid on the wire.
    assert "tool_calls" not in sent["messages"][2]
    assert server.headers[0]["authorization"] == "Bearer sk-test-key"


def test_rate_limit_is_retried_then_succeeds(chat_server):
    def respond(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return 429, {"retry-after": "0"}, b'{"error": {"message": "slow down"}}'
        if n == 2:
            return 503, {}, b'{"error": {"message": "overloaded"}}'
        return 200, {}, completion("done")

    server = chat_server(respond)
    reply = _provider(server).complete(messages=MESSAGES, tools=[], purpose="plan", turn_index=0)

    assert reply.content == "done"
    assert len(server.requests) == 3


def test_every_attempt_names_its_turn_in_an_idempotency_key(chat_server):
    def respond(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return 503, {}, b'{"error": {"message": "overloaded"}}'
        return 200, {}, completion("done")

    server = chat_server(respond)
    _provider(server, turn_key="4b1e-run:3:2").complete(
        messages=MESSAGES, tools=[], purpose="plan", turn_index=0
    )
    _provider(server).complete(messages=MESSAGES, tools=[], purpose="plan", turn_index=0)

    keys = [h.get("idempotency-key") for h in server.headers]
    assert keys == ["4b1e-run:3:2", "4b1e-run:3:2", None]
    assert all("extra_headers" not in r for r in server.requests)


def test_persistent_server_errors_are_retryable_model_errors(chat_server):
    server = chat_server(lambda body, n: (500, {}, b'{"error": {"message": "boom"}}'))

    with pytest.raises(ModelError) as raised:
        _provider(server, max_retries=2).complete(
            messages=MESSAGES, tools=[], purpose="act", turn_index=0
        )

    assert raised.value.retryable is True
    assert len(server.requests) == 3


def test_malformed_reply_fails_clearly_without_retry(chat_server):
    # An empty choices list is retried like a 5xx (tests/runs/providers).
    server = chat_server(lambda _, n: (200, {}, b"this is not json"))

    with pytest.raises(ModelError) as raised:
        _provider(server).complete(
            messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
        )

    assert raised.value.retryable is False
    assert "malformed" in str(raised.value) or "not JSON" in str(raised.value)
    assert len(server.requests) == 1


def test_client_errors_are_not_retried(chat_server):
    server = chat_server(lambda _, n: (401, {}, b'{"error": {"message": "bad key"}}'))

    with pytest.raises(ModelError) as raised:
        _provider(server).complete(messages=MESSAGES, tools=[], purpose="act", turn_index=0)

    assert raised.value.retryable is False
    assert len(server.requests) == 1


def test_agent_model_setting_selects_the_model(settings, chat_server):
    server = chat_server(lambda _, n: (200, {}, completion("ok", model="llama3")))
    settings.OPENAI_BASE_URL = server.base_url

    provider = provider_for("openai:llama3")
    reply = provider.complete(messages=MESSAGES, tools=[], purpose="plan", turn_index=0)

    assert provider.model == "llama3"
    assert server.requests[0]["model"] == "llama3"
    assert reply.model == "llama3"


def test_broken_arguments_are_a_paid_reply_with_the_error_on_the_call(chat_server):
    body = json.dumps(
        {
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "read_file", "arguments": "{not json"},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 7},
        }
    ).encode()
    server = chat_server(lambda _, n: (200, {}, body))

    reply = _provider(server).complete(
        messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
    )

    (call,) = reply.tool_calls
    assert call.name == "read_file" and call.arguments == {}
    assert "not valid JSON" in call.error and call.raw_arguments == "{not json"
    assert (reply.usage.tokens_in, reply.usage.tokens_out) == (50, 7)
    assert len(server.requests) == 1


def test_text_tool_calls_are_parsed_when_the_profile_says_so(chat_server):
    text = (
        "I will read it.\n<tool_call>\n"
        '{"name": "read_file", "arguments": {"path": "calc/core.py"}}\n</tool_call>'
    )
    server = chat_server(lambda _, n: (200, {}, completion(text)))

    plain = _provider(server).complete(
        messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
    )
    parsed = _provider(server, text_tool_calls=True).complete(
        messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=3
    )

    assert plain.tool_calls == [] and "<tool_call>" in plain.content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("read_file", {"path": "calc/core.py"})
    ]
    assert parsed.content == "I will read it."


def test_missing_usage_is_estimated_and_flagged(chat_server):
    body = json.loads(completion("done"))
    del body["usage"]
    server = chat_server(lambda _, n: (200, {}, json.dumps(body).encode()))

    reply = _provider(server).complete(messages=MESSAGES, tools=[], purpose="plan", turn_index=0)

    assert reply.usage.estimated
    assert reply.usage.tokens_in >= len(json.dumps(MESSAGES)) // 5
    assert reply.usage.tokens_out >= 1


def test_estimates_count_with_the_models_own_tokenizer():
    from runs.agent.profiles import tokens_estimate

    code = "def add(a, b):\n    return a + b\n"  # 32 bytes, 12 tokens in both vocabularies
    mixed = "Die Straße ist schön, 東京は晴れ"  # cl100k_base: 13 tokens, o200k_base: 9

    assert tokens_estimate(code, model="gpt-4") == 12
    assert tokens_estimate(mixed, model="gpt-4") == 13
    # A dated name uses its family's vocabulary; an unknown model o200k_base.
    assert tokens_estimate(mixed, model="gpt-4o-2024-08-06") == 9
    assert tokens_estimate(mixed, model="qwen2.5-coder-32b") == 9


def test_profiles_resolve_dated_names_and_keep_explicit_prices(settings):
    from decimal import Decimal

    from runs.agent.profiles import profile_get

    settings.MODEL_PROFILES = {
        **settings.MODEL_PROFILES,
        "local-qwen": {
            "provider": "openai",
            "model": "qwen2.5-coder-32b",
            "base_url": "http://127.0.0.1:1/v1",
            "context_window": 32768,
            "prices_per_million": {"input": "0", "output": "0"},
            "text_tool_calls": True,
        },
    }

    dated = profile_get("openai:gpt-4o-2024-08-06")
    undated_future = profile_get("openai:gpt-4o-2031-01-01")
    qwen = profile_get("local-qwen")

    assert dated.cost(1_000_000, 1_000_000) == Decimal("12.5")
    assert undated_future.catalogue_name == "gpt-4o" and undated_future.context_window == 128000
    assert qwen.cost(10_000, 10_000) == 0 and qwen.text_tool_calls
    assert qwen.context_window == 32768
