"""Native tool use on the protocols that are not Chat Completions: an Anthropic exchange
(parallel ``tool_use`` blocks answered by ``tool_result`` blocks) and a Gemini one
(``functionCall`` answered by ``functionResponse``) round-trip through the provider, and
an Anthropic refusal arrives with Anthropic's own explanation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs.agent.profiles import profile_get
from runs.agent.tools import TOOL_SCHEMAS
from runs.providers import provider_for_profile
from runs.providers.base import ModelError
from tests.runs.providers.fakes import ModelServer, Turn

pytestmark = pytest.mark.no_services


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


CONVERSATION = [
    {"role": "system", "content": "You fix bugs with the tools."},
    {"role": "user", "content": "Fix add() in calc/core.py."},
    {
        "role": "assistant",
        "content": "Reading both files.",
        "tool_calls": [
            _call("toolu_a", "read_file", {"path": "calc/core.py"}),
            _call("toolu_b", "search", {"pattern": "def add"}),
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_a", "content": "def add(a, b):\n    return a - b"},
    {"role": "tool", "tool_call_id": "toolu_b", "content": "calc/core.py:1: def add(a, b):"},
]
FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}


def _profile(settings, name: str, **spec: Any) -> Any:
    settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, name: spec}
    return profile_get(name)


def test_an_anthropic_tool_use_exchange_round_trips(settings, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", "sk-ant-test")

    def script(seen, n):
        return Turn(
            text="Fixing.", calls=[("toolu_c", "replace_text", FIX)], usage=(1200, 40, 1000)
        )

    with ModelServer("anthropic", script, model="claude-sonnet-4-5") as server:
        profile = _profile(
            settings,
            "claude",
            provider="anthropic",
            model="claude-sonnet-4-5",
            base_url=server.base_url,
            api_key_env="ANTHROPIC_TEST_KEY",
            streaming=False,
        )
        reply = provider_for_profile(profile).complete(
            messages=CONVERSATION, tools=TOOL_SCHEMAS, purpose="act", turn_index=1
        )

    assert server.refused == []
    body = server.requests[0]
    assert body["system"][0]["text"] == "You fix bugs with the tools."
    assistant, results = body["messages"][1], body["messages"][2]
    uses = [b for b in assistant["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("toolu_a", "read_file", {"path": "calc/core.py"}),
        ("toolu_b", "search", {"pattern": "def add"}),
    ]
    assert results["role"] == "user"
    assert [b["tool_use_id"] for b in results["content"] if b["type"] == "tool_result"] == [
        "toolu_a",
        "toolu_b",
    ]
    assert reply.content == "Fixing."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("toolu_c", "replace_text", FIX)
    ]
    assert reply.finish_reason == "tool_calls"
    # Anthropic counts cache reads apart; the turn counts them in and as cached.
    assert (reply.usage.tokens_in, reply.usage.tokens_out, reply.usage.tokens_cached) == (
        1200,
        40,
        1000,
    )


def test_an_anthropic_refusal_carries_anthropics_explanation(settings, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", "sk-ant-test")
    prefill = [*CONVERSATION[:2], {"role": "assistant", "content": "Plan: fix it."}]

    with ModelServer("anthropic", lambda seen, n: Turn(text="x")) as server:
        profile = _profile(
            settings,
            "claude",
            provider="anthropic",
            model="claude-sonnet-4-5",
            base_url=server.base_url,
            api_key_env="ANTHROPIC_TEST_KEY",
        )
        with pytest.raises(ModelError) as raised:
            provider_for_profile(profile).complete(
                messages=prefill, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
            )

    assert raised.value.retryable is False and raised.value.status == 400
    assert "does not support assistant message prefill" in str(raised.value)
    assert json.loads(raised.value.body)["error"]["type"] == "invalid_request_error"
    assert len(server.seen) == 1


def test_a_gemini_function_call_exchange_round_trips(settings, monkeypatch):
    monkeypatch.setenv("GEMINI_TEST_KEY", "gemini-test-key")

    def script(seen, n):
        return Turn(calls=[("ignored", "replace_text", FIX)], usage=(800, 25, 0))

    with ModelServer("gemini", script, model="gemini-2.5-flash") as server:
        profile = _profile(
            settings,
            "gem",
            provider="gemini",
            model="gemini-2.5-flash",
            base_url=server.base_url,
            api_key_env="GEMINI_TEST_KEY",
        )
        reply = provider_for_profile(profile).complete(
            messages=CONVERSATION, tools=TOOL_SCHEMAS, purpose="act", turn_index=1
        )

    assert server.refused == []
    (seen,) = server.seen
    assert seen.path.startswith("/v1beta/models/gemini-2.5-flash:generateContent")
    assert "gemini-test-key" in seen.path or seen.headers.get("x-goog-api-key") == "gemini-test-key"
    roles = [c["role"] for c in seen.body["contents"]]
    assert roles[0] == "user" and "model" in roles
    text = json.dumps(seen.body["contents"])
    assert "function_call" in text or "functionCall" in text
    assert "function_response" in text or "functionResponse" in text
    declared = {d["name"] for t in seen.body["tools"] for d in t["function_declarations"]}
    assert {"read_file", "replace_text", "finish"} <= declared
    (call,) = reply.tool_calls
    assert (call.name, call.arguments) == ("replace_text", FIX) and call.id
    assert (reply.usage.tokens_in, reply.usage.tokens_out) == (800, 25)


def test_a_model_without_native_tool_calling_gets_tools_and_history_as_text(settings):
    def script(seen, n):
        block = json.dumps({"name": "replace_text", "arguments": FIX})
        return Turn(text=f"Fixing.\n<tool_call>{block}</tool_call>")

    with ModelServer("local", script, model="phi-4") as server:
        profile = _profile(
            settings,
            "plain-local",
            provider="local",
            model="phi-4",
            base_url=server.base_url,
            tool_use=False,
        )
        reply = provider_for_profile(profile).complete(
            messages=CONVERSATION, tools=TOOL_SCHEMAS, purpose="act", turn_index=1
        )

    body = server.requests[0]
    assert "tools" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user", "user"]
    assert "<tool_call>" in body["messages"][0]["content"]
    assert '"replace_text"' in body["messages"][0]["content"]
    assert '<tool_call>{"name": "read_file"' in body["messages"][2]["content"]
    assert body["messages"][3]["content"].startswith("Result of tool call toolu_a")
    assert reply.content == "Fixing."
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("replace_text", FIX)]
