"""A streamed reply is checkpointed exactly as the same reply sent whole, and while it
arrives the run's timeline shows progress (throttled)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.agent.profiles import profile_get
from runs.agent.tools import TOOL_SCHEMAS
from runs.engine import run_drive_inline
from runs.models import Run
from runs.providers import provider_for_profile
from runs.providers.base import ProviderObserver, StreamProgress
from runs.services import task_submit
from tests.runs.providers.fakes import FIX_ACTS, ModelServer, Turn, fix_script
from tests.runs.providers.timeline import assert_contracts

TURN = Turn(
    text="I will fix the minus sign in add() and run the tests.",
    calls=[
        ("call_1", "replace_text", {"path": "calc/core.py", "old": "a - b", "new": "a + b"}),
        ("call_2", "run_command", {"command": "python3 -m unittest -q"}),
    ],
    usage=(1500, 60, 0),
)
MESSAGES = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix add()."},
]


@pytest.mark.no_services
@pytest.mark.parametrize(
    ("kind", "model"), [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5")]
)
def test_a_streamed_reply_is_the_reply_sent_whole(kind, model, settings, monkeypatch):
    monkeypatch.setenv("FAKE_MODEL_KEY", "k")
    settings.MODEL_STREAM_PROGRESS_SECONDS = 0.01
    heard: list[StreamProgress] = []
    replies: dict[bool, Any] = {}
    with ModelServer(kind, lambda seen, n: TURN, model=model, chunk_delay=0.005) as server:
        for streaming in (False, True):
            settings.MODEL_PROFILES = {
                **settings.MODEL_PROFILES,
                "fake": {
                    "provider": kind,
                    "model": model,
                    "base_url": server.base_url,
                    "api_key_env": "FAKE_MODEL_KEY",
                    "streaming": streaming,
                },
            }
            provider = provider_for_profile(
                profile_get("fake"), observer=ProviderObserver(progress=heard.append)
            )
            replies[streaming] = provider.complete(
                messages=MESSAGES, tools=TOOL_SCHEMAS, purpose="act", turn_index=0
            )

    whole, streamed = replies[False].to_json(), replies[True].to_json()
    assert [bool(b.get("stream")) for b in server.requests] == [False, True]
    assert streamed == whole
    assert [c["name"] for c in streamed["tool_calls"]] == ["replace_text", "run_command"]
    assert streamed["usage"]["tokens_in"] == 1500 and streamed["usage"]["tokens_out"] == 60
    assert heard, "no progress was reported while the reply streamed"
    assert [p.chars for p in heard] == sorted(p.chars for p in heard)
    assert heard[-1].chunks > 1


@pytest.mark.django_db(transaction=True)
def test_a_slow_streamed_turn_shows_progress_on_the_timeline(
    workspace, repository, settings, monkeypatch
):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)
    monkeypatch.setenv("FAKE_MODEL_KEY", "k")
    settings.MODEL_STREAM_PROGRESS_SECONDS = 0.05
    script = fix_script(FIX_ACTS)
    with ModelServer("anthropic", script, model="claude-sonnet-4-5", chunk_delay=0.03) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "slow-claude": {
                "provider": "anthropic",
                "model": "claude-sonnet-4-5",
                "base_url": server.base_url,
                "api_key_env": "FAKE_MODEL_KEY",
            },
        }
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "slow-claude"},
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert all(body.get("stream") for body in server.requests)
    progress = list(run.events.filter(type="agent.model.stream.progress").order_by("sequence_no"))
    assert progress
    assert {e.data["purpose"] for e in progress} >= {"plan", "act"}
    # Each turn's progress comes before the turn's answer is checkpointed.
    first_answer = run.events.filter(type="agent.model.turn.completed").order_by("sequence_no")[0]
    assert progress[0].sequence_no < first_answer.sequence_no
    assert_contracts(run, "agent.model.stream.progress")
