"""A whole run against a Chat Completions server that answers the way real models do.

The transcript plays, in order: a rate limit, a plan without usage, a server error,
parallel tool calls, arguments written as a Python dict, an unknown tool, an
unexpected parameter, a text-only answer, a reply cut off at the output limit, a
context-length refusal, then a correct fix. The run must recover from each, complete,
and count every paid reply.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run, ToolCall
from runs.services import task_submit
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    """These runs are driven in this process with test-only profiles; no wake-up message
    may reach a worker process elsewhere, which would not know those profiles."""
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}


def _call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def _body(
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    *,
    finish: str | None = None,
    usage: tuple[int, int] | None = (900, 40),
    model: str = "gpt-4o-2024-08-06",
) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish or ("tool_calls" if calls else "stop"),
            }
        ],
    }
    if usage:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return json.dumps(body).encode()


CONTEXT_REFUSAL = json.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 128000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
).encode()

TRANSCRIPT: list[tuple[int, dict[str, str], bytes]] = [
    (429, {"retry-after": "0"}, b'{"error": {"message": "rate limited"}}'),
    (200, {}, _body("1. Read calc/core.py 2. Fix add 3. Test", usage=None)),
    (503, {}, b'{"error": {"message": "overloaded"}}'),
    (
        200,
        {},
        _body(
            "Reading in parallel.",
            [
                _call("read_file", {"path": "calc/core.py"}, "c1"),
                _call("search", {"pattern": "def add"}, "c2"),
            ],
        ),
    ),
    (
        200,
        {},
        _body(None, [_call("replace_text", str(FIX), "c3")]),  # a Python dict, not JSON
    ),
    (
        200,
        {},
        _body(None, [_call("apply_patch", {"patch": "*** Begin Patch"}, "c4")]),
    ),
    (
        200,
        {},
        _body(None, [_call("read_file", {"path": "calc/core.py", "view_range": [1, 5]}, "c5")]),
    ),
    (200, {}, _body("I believe add() is wrong and should be fixed.")),
    (
        200,
        {},
        _body(
            None,
            [_call("write_file", '{"path": "calc/core.py", "content": "def a', "c6")],
            finish="length",
        ),
    ),
    (400, {}, CONTEXT_REFUSAL),
    (200, {}, _body("Fixing.", [_call("replace_text", FIX, "c7")])),
    (
        200,
        {},
        _body(
            None,
            [_call("run_command", {"command": "python3 -m unittest -q"}, "c8")],
            usage=(1000, 20),
        ),
    ),
    (200, {}, _body(None, [_call("finish", {"summary": "add() fixed"}, "c9")])),
]
PAID_REPLIES = sum(1 for status, _, _ in TRANSCRIPT if status == 200)


@contextlib.contextmanager
def awkward_profile(settings: Any) -> Iterator[ChatCompletionsServer]:
    """The transcript's server, and profile "awkward" pointing at it."""

    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        if n > len(TRANSCRIPT):
            return 200, {}, _body(None, [_call("finish", {}, f"extra{n}")])
        return TRANSCRIPT[n - 1]

    with ChatCompletionsServer(respond) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "awkward": {
                "provider": "openai",
                "model": "gpt-4o",
                "base_url": server.base_url,
                "api_key_env": "AWKWARD_TEST_KEY",
            },
        }
        settings.OPENAI_RETRY_BACKOFF_SECONDS = 0.01
        yield server


@pytest.fixture
def awkward_server(settings):
    with awkward_profile(settings) as server:
        yield server


def test_run_recovers_from_every_awkward_answer_and_counts_every_reply(
    workspace, repository, awkward_server
):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": "awkward"},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert run.patches.get().files_changed == ["calc/core.py"]
    requests = awkward_server.requests
    assert len(requests) == len(TRANSCRIPT)
    # Every paid reply is a stored turn, and the run's totals are their sum.
    turns = list(ModelTurn.objects.filter(run=run).order_by("step_no", "turn_no"))
    assert len(turns) == PAID_REPLIES
    assert run.tokens_in == sum(t.tokens_in for t in turns)
    assert run.cost_usd == sum((t.cost_usd for t in turns), Decimal(0))
    plan = turns[0]
    assert plan.usage_estimated and plan.tokens_in > 0 and plan.cost_usd > 0
    # A dated name is priced as gpt-4o: $2.50 in and $10 out per million.
    priced = next(t for t in turns if t.tokens_in == 1000 and t.tokens_out == 20)
    assert priced.cost_usd == Decimal("0.002700")
    assert [t.problem for t in turns if t.problem] == [
        "invalid_tool_call",
        "invalid_tool_call",
        "invalid_tool_call",
        "text_only",
        "length",
    ]
    assert run.events.filter(type="agent.model.error").count() == 5
    assert all(r.get("max_tokens") for r in requests[1:])
    # The system prompt states the rules and is stored with the run.
    prompt = requests[1]["messages"][0]["content"]
    for rule in (repository.test_command, ".github/workflows/**", "model_errors 8", "finish"):
        assert rule in prompt
    assert run.artifacts.filter(name__startswith="system prompt v").exists()

    def tool_answer(request: dict[str, Any], call_id: str) -> str:
        return next(m["content"] for m in request["messages"] if m.get("tool_call_id") == call_id)

    # Each mistake went back to the model as a tool error stating it, with the schema.
    bad_json = tool_answer(requests[5], "c3")
    assert "not valid JSON" in bad_json and '"old"' in bad_json
    unknown = tool_answer(requests[6], "c4")
    assert "unknown tool 'apply_patch'" in unknown and "str_replace_editor" in unknown
    wrong = tool_answer(requests[7], "c5")
    assert "view_range" in wrong and '"start_line"' in wrong and "TypeError" not in wrong
    assert "no tool call" in requests[8]["messages"][-1]["content"]
    assert "cut off" in requests[9]["messages"][-1]["content"]
    # The refusal was answered by condensing; the condensed request is what was resent.
    assert len(json.dumps(requests[10]["messages"])) < len(json.dumps(requests[9]["messages"]))
    assert run.events.filter(
        type="agent.context.condensed", data__reason="context_length_exceeded"
    ).exists()
    # Rejected calls never ran and do not count as tool retries.
    rejected = ToolCall.objects.filter(run=run, status="rejected")
    assert rejected.count() == 4
    assert not ToolCall.objects.filter(run=run, status__in=["failed", "denied"]).exists()
    assert all(
        "authorization" not in h or h["authorization"] == "Bearer not-needed"
        for h in awkward_server.headers
    )


def test_model_errors_budget_ends_the_run(workspace, repository, settings):
    text_only = _body("Thinking about it.")
    with ChatCompletionsServer(lambda body, n: (200, {}, text_only)) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "chatty": {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url},
        }
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "chatty"},
            budget={"model_errors": 3},
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "budget_model_errors")
    # Exactly the limit: the third bad reply ends the run, no fourth is bought.
    assert ModelTurn.objects.filter(run=run, problem="text_only").count() == 3
    assert len(server.requests) == 4  # the plan and three acting turns, all stored


def test_second_context_refusal_fails_with_context_exhausted(workspace, repository, settings):
    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        if not body.get("tools"):
            return 200, {}, _body("plan")
        if n == 2:
            return 200, {}, _body(None, [_call("read_file", {"path": "calc/core.py"}, "r1")])
        return 400, {}, CONTEXT_REFUSAL

    with ChatCompletionsServer(respond) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "tight": {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url},
        }
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "tight"},
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "context_exhausted")
    assert len(server.requests) == 4  # plan, one turn, a refusal, one condensed retry


def test_a_resumed_run_sends_exactly_the_condensed_history(workspace, repository, settings):
    """A refusal condenses the history, which is checkpointed before it is sent again; a
    worker that dies waiting for that answer resumes by sending the very same request."""

    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        if not body.get("tools"):
            return 200, {}, _body("plan")
        if n == 2:
            return 200, {}, _body(None, [_call("read_file", {"path": "calc/core.py"}, "r1")])
        if n == 3:
            return 400, {}, CONTEXT_REFUSAL
        if n == 4:
            return 500, {}, b'{"error": {"message": "worker lost the answer"}}'
        if n == 5:
            return 200, {}, _body("Fixing.", [_call("replace_text", FIX, "r2")])
        return 200, {}, _body(None, [_call("finish", {"summary": "done"}, f"f{n}")])

    with ChatCompletionsServer(respond) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "flaky": {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url},
        }
        settings.OPENAI_MAX_RETRIES = 0
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "flaky"},
        )
        with pytest.raises(Exception, match="still failing"):
            run_drive_inline(run_id=submission.run.id)
        run = run_drive_inline(run_id=submission.run.id)  # the retry, as a new worker

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    refused, lost, resumed = (server.requests[i]["messages"] for i in (2, 3, 4))
    assert lost != refused
    assert resumed == lost


def test_an_unknown_profile_is_refused_at_submission(workspace, repository):
    from runs.models import Task
    from runs.services import CommandRefused

    with pytest.raises(CommandRefused) as refused:
        task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "no-such-profile"},
        )

    assert refused.value.code == "model_profile_unknown"
    assert "no-such-profile" in refused.value.message
    repository.model_profile = "gone-profile"
    repository.save(update_fields=["model_profile"])
    with pytest.raises(CommandRefused, match="gone-profile"):
        task_submit(workspace=workspace, repository=repository, instruction="Fix add()")
    assert not Task.objects.exists()


def test_the_repository_profile_is_used_when_the_task_names_none(workspace, repository, settings):
    from runs.agent.profiles import profile_name_for

    settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, "repo-default": {"provider": "scripted"}}
    workspace.model_profile = "openai"
    workspace.save(update_fields=["model_profile"])
    repository.model_profile = "repo-default"
    repository.save(update_fields=["model_profile"])
    task = task_submit(workspace=workspace, repository=repository, instruction="Fix add()").task
    named = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add() again",
        model_options={"profile": "scripted"},
    ).task

    assert profile_name_for(task) == "repo-default"
    assert profile_name_for(named) == "scripted"
    repository.model_profile = ""
    repository.save(update_fields=["model_profile"])
    task.refresh_from_db()
    assert profile_name_for(task) == "openai"


def test_condensation_keeps_a_long_run_under_a_small_window(
    workspace, repository, monkeypatch, settings
):
    """A light version of a 300-turn run (the conversation-level test in test_agent_tools
    plays 300 turns): 120 turns on an 8,192-token window. Every request stays under the
    window because older outputs are condensed, and the run still finishes."""
    window = 8_192
    settings.MODEL_PROFILES = {
        **settings.MODEL_PROFILES,
        "small-window": {
            "provider": "scripted",
            "model": "scripted-1",
            "context_window": window,
            "max_output_tokens": 512,
        },
    }
    # Fewer, longer steps keep the test quick; the turns and their checkpoints are the same.
    monkeypatch.setattr("runs.steps.running.TURNS_PER_STEP", 40)
    # Each read asks for a different window (the same call again and again would be a
    # loop, stopped after a few turns: see tests/runs/agent/test_nothing_thrown_away.py).
    turns = [
        {
            "tool_calls": [
                {
                    "name": "read_file",
                    "arguments": {
                        "path": "calc/core.py" if n % 2 else "tests/test_core.py",
                        "end_line": 200 + n,
                    },
                }
            ]
        }
        for n in range(119)
    ]
    script = {"turns": [*turns, {"tool_calls": [{"name": "replace_text", "arguments": FIX}]}]}
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": "small-window", "script": script},
        budget={"model_turns": 200},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    acting = ModelTurn.objects.filter(run=run, purpose="act")
    assert acting.count() >= 120
    assert max(acting.values_list("tokens_in", flat=True)) < window
    assert run.events.filter(type="agent.context.condensed").count() > 10
    # Uncondensed, the tool outputs alone would not have fit.
    outputs = ToolCall.objects.filter(run=run).values_list("result", flat=True)
    assert sum(len(r.get("output", "")) for r in outputs) // 4 > window
