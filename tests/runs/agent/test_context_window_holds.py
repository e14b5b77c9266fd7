"""A 16k-window model with long tool outputs: every request fits before it is sent.

The local Chat Completions server counts each request with the model's tokenizer (the
messages and tools as they travel, plus the output cap it was asked for) and refuses
what is over the window, as vLLM and the hosted APIs do. A long run whose every tool
output is thousands of tokens must get no refusal at all, and a run killed before a
request and resumed from its checkpoint must send that request byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import bpe_openai
import pytest

from runs import protocol
from runs.agent.context import context_condense, messages_tokens
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run
from runs.services import task_submit
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer, completion

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 16_384
OUTPUT_CAP = 2_048
LONG_TURNS = 24
NOTE = "[earlier turns condensed]"
ENCODING = bpe_openai.get_encoding("o200k_base")


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def request_tokens(body: dict[str, Any]) -> int:
    """What the server counts: messages and tools as sent, and the reply it may write."""
    text = json.dumps(body["messages"]) + json.dumps(body.get("tools") or [])
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return len(ENCODING.encode(text)) + int(cap)


def long_output_call(turn: int) -> dict[str, Any]:
    script = (
        f"for i in range({turn}, {turn} + 900): "
        "print(i, 'lorem ipsum dolor sit amet, consectetur adipiscing', i * 7919 % 10007)"
    )
    command = f'python3 -c "{script}"'
    return {"id": f"long{turn}", "name": "run_command", "arguments": {"command": command}}


def script_reply(body: dict[str, Any]) -> bytes:
    """The next move, from the conversation (so a resumed run gets the same answers)."""
    if not body.get("tools"):
        if body["messages"][0]["content"].startswith("You condense"):
            return completion("SUMMARY: printed long listings; add() in calc/core.py subtracts.")
        return completion("1. Explore. 2. Fix add(). 3. Test. 4. Finish.")
    ids = {call["id"] for m in body["messages"] for call in (m.get("tool_calls") or [])}
    done = {i for i in ids if i.startswith("long")}
    turn = len(done)
    # A condensed history may have dropped early calls; the newest call id tells the turn.
    for message in reversed(body["messages"]):
        if message.get("tool_calls"):
            last = message["tool_calls"][0]["id"]
            break
    else:
        last = ""
    if last.startswith("long"):
        turn = int(last[4:]) + 1
    if last in ("", "plan") or (last.startswith("long") and turn < LONG_TURNS):
        return completion("Looking.", [long_output_call(turn)])
    if last.startswith("long"):
        fix = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}
        return completion("Fixing.", [{"id": "fix", "name": "replace_text", "arguments": fix}])
    if last == "fix":
        return completion("", [{"id": "test", "name": "run_tests", "arguments": {}}])
    return completion("", [{"id": "done", "name": "finish", "arguments": {"summary": "fix add"}}])


class WindowServer(ChatCompletionsServer):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.refusals = 0
        super().__init__(self.answer)

    def answer(self, body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
        size = request_tokens(body)
        self.sizes.append(size)
        if size > WINDOW:
            self.refusals += 1
            message = (
                f"This model's maximum context length is {WINDOW} tokens. However, you "
                f"requested {size} tokens. Please reduce the length of the messages."
            )
            error = {"message": message, "type": "invalid_request_error"}
            error["code"] = "context_length_exceeded"
            return 400, {}, json.dumps({"error": error}).encode()
        return 200, {}, script_reply(body)


@pytest.fixture
def small_window(settings):
    with WindowServer() as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "small": {
                "provider": "openai",
                "model": "gpt-4o",
                "base_url": server.base_url,
                "context_window": WINDOW,
                "max_output_tokens": OUTPUT_CAP,
            },
        }
        yield server


@pytest.fixture
def small_window_summarizing(small_window, settings):
    profile = settings.MODEL_PROFILES["small"]
    settings.MODEL_PROFILES["small"] = {**profile, "condense_summary": True}
    return small_window


def _submit(workspace, repository):
    return task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": "small"},
        budget={"model_turns": 60},
        execution_mode="autonomous_pr",
    )


def test_long_run_with_long_outputs_never_passes_the_window(workspace, repository, small_window):
    submission = _submit(workspace, repository)

    run = run_drive_inline(run_id=submission.run.id)

    assert small_window.refusals == 0, small_window.sizes
    assert max(small_window.sizes) <= WINDOW
    assert len(small_window.sizes) >= LONG_TURNS + 3
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    events = run.events.filter(type="agent.context.condensed")
    condensed = list(events.values_list("data", flat=True))
    assert condensed and all(e["tokens_after"] <= e["limit"] for e in condensed)
    # One note stands for every dropped turn; notes do not pile up, nor empty ones appear.
    last = small_window.requests[-1]["messages"]
    notes = [m for m in last if (m.get("content") or "").startswith("[earlier turns condensed]")]
    assert len(notes) <= 1
    assert not any(" 0 earlier tool calls" in (m.get("content") or "") for m in last)
    # Observation masking: the old long outputs became placeholders, the newest stayed.
    long_results = [
        m["content"]
        for r in small_window.requests[-1:]
        for m in r["messages"]
        if m.get("role") == "tool" and m["tool_call_id"].startswith("long")
    ]
    assert long_results[-1].startswith("[exit code 0]")
    assert sum(c.startswith("[condensed]") for c in long_results) >= len(long_results) - 2


def test_older_turns_can_be_condensed_into_a_summary_the_model_writes(
    workspace, repository, small_window_summarizing
):
    server = small_window_summarizing

    run = run_drive_inline(run_id=_submit(workspace, repository).run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert server.refusals == 0 and max(server.sizes) <= WINDOW
    summaries = ModelTurn.objects.filter(run=run, purpose="summarize")
    assert summaries.exists()
    last = server.requests[-1]["messages"]
    notes = [m["content"] for m in last if m["content"] and NOTE in m["content"]]
    assert len(notes) == 1 and "SUMMARY: printed long listings" in notes[0]


def test_a_resumed_run_sends_the_byte_identical_request(
    workspace, repository, small_window, monkeypatch
):
    reference = run_drive_inline(run_id=_submit(workspace, repository).run.id)
    assert reference.status == Run.Status.COMPLETED
    sent = [json.dumps(r["messages"]) for r in small_window.requests]
    small_window.requests.clear()

    # The second run's worker dies right before its 12th request, after condensing.
    calls = {"n": 0}
    original = protocol.StepContext.check_cancelled

    def dies_once(self):
        calls["n"] += 1
        if len(small_window.requests) == 11 and not calls.get("died"):
            calls["died"] = True
            raise SystemExit("worker killed")
        return original(self)

    monkeypatch.setattr(protocol.StepContext, "check_cancelled", dies_once)
    run_id = _submit(workspace, repository).run.id
    with pytest.raises(SystemExit):
        run_drive_inline(run_id=run_id)
    Run.objects.filter(pk=run_id).update(lease_owner="", lease_until=None)
    resumed = run_drive_inline(run_id=run_id)

    assert calls.get("died") and resumed.status == Run.Status.COMPLETED
    again = [json.dumps(r["messages"]) for r in small_window.requests]
    assert again == sent


def test_condensing_holds_a_small_budget_turn_after_turn():
    budget = 8_084
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "rules " * 300},
        {"role": "user", "content": "Task: fix add()"},
        {"role": "assistant", "content": "Plan: read, fix, test"},
    ]
    sizes, notes = [], []
    for turn in range(60):
        target = budget * 7 // 10
        messages = context_condense(messages, budget, target_tokens=target, model="gpt-4o")
        sizes.append(messages_tokens(messages, model="gpt-4o"))
        notes.append(sum(1 for m in messages if NOTE in (m.get("content") or "")))
        function = {"name": "read_file", "arguments": "{}"}
        call = {"id": f"c{turn}", "type": "function", "function": function}
        messages.append({"role": "assistant", "content": f"turn {turn}", "tool_calls": [call]})
        output = "\n".join(f"{turn} line {n} " + "word " * 12 for n in range(400))
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": output})

    assert max(sizes) <= budget, sizes
    assert max(notes) <= 1
    assert len(messages) < 30


def test_a_single_huge_newest_output_is_cut_to_its_head_and_tail():
    lines = [f"row {n}: " + "value " * 10 for n in range(3000)]
    call = {"id": "big", "type": "function", "function": {"name": "run_command", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "Task: fix add()"},
        {"role": "assistant", "content": "Plan: run it", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "big", "content": "\n".join(lines)},
    ]

    fitted = context_condense(messages, 3_000, model="gpt-4o")

    assert messages_tokens(fitted, model="gpt-4o") <= 3_000
    output = fitted[-1]["content"]
    assert output.startswith("row 0:") and output.rstrip().endswith(lines[-1].rstrip())
    assert "clipped" in output
    assert fitted[:3] == messages[:3]
