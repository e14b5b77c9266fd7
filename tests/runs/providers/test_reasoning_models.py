"""Reasoning models get the parameters they take: ``max_completion_tokens`` and
``reasoning_effort``, never ``max_tokens`` or ``temperature`` (the server refuses those
as OpenAI's does). When a request is refused anyway, the provider's explanation reaches
the run's failure detail and its timeline."""

from __future__ import annotations

import pytest

from runs.agent.profiles import profile_get
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run
from runs.providers import provider_for_profile
from runs.services import task_submit
from tests.runs.providers.fakes import FIX_ACTS, ModelServer, Turn, fix_script
from tests.runs.providers.timeline import assert_contracts

pytestmark = pytest.mark.django_db(transaction=True)

MAX_TOKENS_REFUSED = "Use 'max_completion_tokens' instead"


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def _profile(settings, name: str, **spec) -> None:
    settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, name: spec}


def _submit(workspace, repository, profile: str) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": profile, "model_judge": True},
    )
    return run_drive_inline(run_id=submission.run.id)


def test_o3_mini_runs_with_reasoning_parameters_and_no_sampling(workspace, repository, settings):
    with ModelServer("openai", fix_script(FIX_ACTS), model="o3-mini") as server:
        _profile(settings, "o3", provider="openai", model="o3-mini", base_url=server.base_url)
        run = _submit(workspace, repository, "o3")

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert server.refused == []
    purposes = list(ModelTurn.objects.filter(run=run).values_list("purpose", flat=True))
    assert sorted(set(purposes)) == ["act", "judge", "plan"]
    for body in server.requests:
        assert body["max_completion_tokens"] > 0
        assert body["reasoning_effort"] == "medium"
        assert "max_tokens" not in body and "temperature" not in body


def test_a_refusal_reaches_the_failure_detail_and_the_timeline(workspace, repository, settings):
    # A deployment name hides the model: only the profile can say that it reasons. Said
    # wrongly, max_tokens is sent and refused.
    with ModelServer("openai", fix_script(FIX_ACTS), model="team-reasoner") as server:
        _profile(
            settings, "hidden", provider="openai", model="team-reasoner", base_url=server.base_url
        )
        run = _submit(workspace, repository, "hidden")

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "model_error")
    assert "HTTP 400" in run.failure_detail and MAX_TOKENS_REFUSED in run.failure_detail
    assert len(server.seen) == 1  # a refusal is not retried
    failed = run.events.get(type="agent.model.request.failed")
    assert failed.data["status"] == 400 and failed.data["retryable"] is False
    assert MAX_TOKENS_REFUSED in failed.data["error"]
    assert_contracts(run, "agent.model.request.failed")
    assert run.events.filter(type="agent.run.failed").exists()


def test_a_profile_that_states_reasoning_gets_the_reasoning_parameters(
    workspace, repository, settings
):
    with ModelServer("openai", fix_script(FIX_ACTS), model="team-reasoner") as server:
        _profile(
            settings,
            "declared",
            provider="openai",
            model="team-reasoner",
            base_url=server.base_url,
            reasoning=True,
            reasoning_effort="low",
        )
        run = _submit(workspace, repository, "declared")

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert server.refused == []
    assert all(b["reasoning_effort"] == "low" and "max_tokens" not in b for b in server.requests)
    assert all("temperature" not in b for b in server.requests)


def test_the_judge_asks_temperature_zero_only_where_sampling_is_allowed(settings):
    def judge(seen, n):
        return Turn(text='{"verdict": "accept", "score": 1}')

    messages = [{"role": "system", "content": "judge"}, {"role": "user", "content": "patch"}]
    with ModelServer("openai", judge, model="gpt-4o") as server:
        _profile(settings, "plain", provider="openai", model="gpt-4o", base_url=server.base_url)
        _profile(settings, "gpt5", provider="openai", model="gpt-5", base_url=server.base_url)
        for name in ("plain", "gpt5"):
            provider_for_profile(profile_get(name)).complete(
                messages=messages, tools=[], purpose="judge", turn_index=0
            )

    plain, reasoning = server.requests
    assert plain["temperature"] == 0 and plain["max_tokens"] > 0
    assert "temperature" not in reasoning and reasoning["max_completion_tokens"] > 0
    assert reasoning["reasoning_effort"] == "medium"


def test_the_responses_api_gets_reasoning_effort_and_its_own_output_cap(settings):
    def script(seen, n):
        return Turn(calls=[("call_r", "read_file", {"path": "calc/core.py"})], usage=(50, 9, 0))

    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix add()."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "calc/core.py"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    with ModelServer("openai-responses", script, model="o4-mini") as server:
        _profile(
            settings,
            "o4",
            provider="openai-responses",
            model="o4-mini",
            base_url=server.base_url,
            reasoning_effort="high",
        )
        reply = provider_for_profile(profile_get("o4")).complete(
            messages=messages, tools=tools, purpose="act", turn_index=0
        )

    (seen,) = server.seen
    assert seen.path == "/v1/responses" and server.refused == []
    assert seen.body["reasoning"]["effort"] == "high"
    assert seen.body["max_output_tokens"] > 0 and "temperature" not in seen.body
    kinds = [item.get("type") for item in seen.body["input"]]
    assert "function_call" in kinds and "function_call_output" in kinds
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_r", "read_file", {"path": "calc/core.py"})
    ] or [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("read_file", {"path": "calc/core.py"})
    ]
    assert (reply.usage.tokens_in, reply.usage.tokens_out) == (50, 9)


def test_a_local_servers_reasoning_content_is_kept_and_costs_nothing(settings):
    def script(seen, n):
        return Turn(text="add() subtracts.", reasoning="The bug is the minus sign.")

    with ModelServer("local", script, model="Qwen/QwQ-32B") as server:
        _profile(settings, "vllm", provider="local", model="Qwen/QwQ-32B", base_url=server.base_url)
        profile = profile_get("vllm")
        reply = provider_for_profile(profile).complete(
            messages=[{"role": "user", "content": "Why does add() fail?"}],
            tools=[],
            purpose="plan",
            turn_index=0,
        )

    assert reply.content == "add() subtracts."
    assert reply.reasoning == "The bug is the minus sign."
    assert reply.to_json()["reasoning"] == "The bug is the minus sign."
    assert profile.cost(1_000_000, 1_000_000) == 0
    assert server.requests[0]["model"] == "Qwen/QwQ-32B"


def test_capabilities_follow_the_model_unless_the_profile_states_them(settings):
    settings.MODEL_PROFILES = {
        **settings.MODEL_PROFILES,
        "thinking-claude": {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "reasoning": True,
            "reasoning_effort": "low",
        },
        "sampled-o3": {"provider": "openai", "model": "o3-mini", "sampling": True},
    }

    settings.OPENAI_BASE_URL = "https://api.openai.com/v1"
    o3 = profile_get("openai:o3-mini")
    assert (o3.reasoning, o3.reasoning_effort, o3.sampling) == (True, "medium", False)
    assert o3.streaming and not o3.prompt_caching
    settings.OPENAI_BASE_URL = "http://127.0.0.1:8000/v1"  # a compatible server
    assert not profile_get("openai:o3-mini").streaming
    gpt4o = profile_get("openai:gpt-4o")
    assert (gpt4o.reasoning, gpt4o.reasoning_effort, gpt4o.sampling) == (False, "", True)
    claude = profile_get("thinking-claude")
    assert (claude.reasoning_effort, claude.sampling) == ("low", False)
    assert claude.streaming and claude.prompt_caching
    assert profile_get("sampled-o3").sampling is True
    assert profile_get("scripted").cost(10**6, 10**6) == 0
    assert profile_get("local").cost(10**6, 10**6) == 0
