"""A task submitted through the API runs to completion against each protocol's server:
OpenAI Chat Completions (streamed), an OpenAI-compatible local server in the manner of
vLLM, the OpenAI Responses API with a reasoning model, Anthropic Messages (streamed,
with prompt caching) and Gemini. Each server refuses what its real counterpart refuses,
so a request shaped wrongly for the protocol fails the run."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from runs.engine import run_drive_inline
from runs.models import Membership, ModelTurn, Run
from tests.factories import UserFactory
from tests.runs.providers.fakes import FIX_ACTS, ModelServer, fix_script

pytestmark = pytest.mark.django_db(transaction=True)

# kind -> (model, extra profile settings, the path each request goes to)
PROTOCOLS: dict[str, tuple[str, dict[str, Any], str]] = {
    "openai": ("gpt-4o", {"streaming": True}, "/v1/chat/completions"),
    "local": ("Qwen/Qwen3-Coder-30B-A3B-Instruct", {"streaming": True}, "/v1/chat/completions"),
    "openai-responses": ("o4-mini", {}, "/v1/responses"),
    "anthropic": ("claude-sonnet-4-5", {}, "/v1/messages"),
    "gemini": ("gemini-2.5-flash", {}, "/v1beta/models/gemini-2.5-flash:generateContent"),
}


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    """Driven in this process with a test-only profile: no wake-up may reach a worker."""
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


@pytest.fixture
def member_client(workspace):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.MEMBER)
    client = APIClient()
    client.force_authenticate(user)
    return client


def run_through_api(client: APIClient, repository: Any, profile: str) -> Run:
    response = client.post(
        "/api/tasks/",
        {
            "repository": repository.pk,
            "instruction": "Fix add()",
            "model_options": {"profile": profile, "model_judge": True},
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    return run_drive_inline(run_id=response.json()["run_id"])


@pytest.mark.parametrize("kind", list(PROTOCOLS))
def test_a_task_runs_to_completion_on_each_protocol(
    kind, workspace, repository, member_client, settings, monkeypatch
):
    model, extra, path = PROTOCOLS[kind]
    monkeypatch.setenv("FAKE_MODEL_KEY", "sk-fake-key")
    with ModelServer(kind, fix_script(FIX_ACTS), model=model) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "fake": {
                "provider": kind,
                "model": model,
                "base_url": server.base_url,
                "api_key_env": "FAKE_MODEL_KEY",
                "prices_per_million": {"input": "1", "output": "4", "cached": "0.1"},
                **extra,
            },
        }
        run = run_through_api(member_client, repository, "fake")

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert server.refused == []
    assert {s.path.split("?")[0] for s in server.seen} == {path}
    assert run.patches.get().files_changed == ["calc/core.py"]
    turns = list(ModelTurn.objects.filter(run=run).order_by("step_no", "turn_no"))
    # plan, three acting turns, the model judge: one request each
    assert [t.purpose for t in turns] == ["plan", "act", "act", "act", "judge"]
    assert len(server.seen) == 5
    acts = [t for t in turns if t.purpose == "act"]
    assert [c["name"] for t in acts for c in t.response["tool_calls"]] == [
        "replace_text",
        "run_command",
        "finish",
    ]
    first = acts[0]
    assert (first.tokens_in, first.tokens_out, first.tokens_cached) == (900, 30, 600)
    # 300 fresh tokens at $1, 600 cached at $0.10, 30 out at $4 per million
    assert first.cost_usd == Decimal("0.00048")
    assert run.cost_usd == sum((t.cost_usd for t in turns), Decimal(0))
    # Every request after the plan ends with the user's (or a tool's) turn.
    for seen in server.seen[1:4]:
        assert "Carry out the plan" in seen.text
    keys = {s.headers.get("idempotency-key") for s in server.seen}
    assert keys == {f"{run.id}:{t.step_no}:{t.turn_no}" for t in turns}


def test_anthropic_requests_carry_native_tools_and_cache_breakpoints(
    workspace, repository, member_client, settings, monkeypatch
):
    monkeypatch.setenv("FAKE_MODEL_KEY", "sk-ant-fake")
    with ModelServer("anthropic", fix_script(FIX_ACTS), model="claude-sonnet-4-5") as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "claude": {
                "provider": "anthropic",
                "model": "claude-sonnet-4-5",
                "base_url": server.base_url,
                "api_key_env": "FAKE_MODEL_KEY",
            },
        }
        run = run_through_api(member_client, repository, "claude")

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    last_act = server.seen[3]
    assert last_act.path == "/v1/messages"
    assert last_act.headers["x-api-key"] == "sk-ant-fake"
    body = last_act.body
    assert {t["name"] for t in body["tools"]} >= {"read_file", "replace_text", "finish"}
    assert all("input_schema" in t for t in body["tools"])
    # The system prompt and the newest message are cache breakpoints.
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    # Earlier calls went back as tool_use blocks, answered by tool_result blocks.
    uses = [
        b
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    results = [
        b
        for m in body["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if isinstance(b, dict) and b["type"] == "tool_result"
    ]
    assert [u["id"] for u in uses] == ["call_fix", "call_test"]
    assert [r["tool_use_id"] for r in results] == ["call_fix", "call_test"]
    assert "Replaced" in json.dumps(results[0]) or "calc/core.py" in json.dumps(results[0])
    assert body["max_tokens"] > 0 and "temperature" not in body
