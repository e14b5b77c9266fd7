"""The conversation kept within the model's context window.

Tool outputs are clipped when they are produced (a visible marker says what was left
out and how to see it). Before the conversation reaches a share of the window, older
tool outputs are condensed to one line each; what the model needs to go on is kept:
the system prompt, the task, the plan, the latest edits and test results, and the
most recent turns. If that is still too much, the oldest turns are dropped whole
(a call and its result go together, as the protocol requires) behind a note listing
what they did. Condensing is a pure function of the messages and the budget, and its
result is what the run checkpoints, so a resumed run sends exactly what the original
would have.
"""

from __future__ import annotations

import json
from typing import Any

from runs.agent.profiles import tokens_estimate

KEEP_RECENT_MESSAGES = 12
CONDENSED_PREFIX = "[condensed]"
DROPPED_PREFIX = "[earlier turns condensed]"
EDIT_TOOLS = frozenset({"insert", "write_file", "replace_text", "undo_edit", "str_replace_editor"})
TEST_TOOLS = frozenset({"run_tests", "run_command"})
ARGUMENT_KEEP_CHARS = 300


def clip(text: str, *, max_chars: int = 12_000, max_lines: int = 300) -> str:
    """``text`` whole, or its head and tail around a marker saying what was left out."""
    lines = text.splitlines()
    if len(text) <= max_chars and len(lines) <= max_lines:
        return text
    head_lines = max_lines * 2 // 3
    tail_lines = max_lines - head_lines
    head = lines[:head_lines]
    tail = lines[-tail_lines:] if len(lines) > head_lines else []
    while head and len("\n".join(head)) > max_chars * 2 // 3:
        head = head[: len(head) * 3 // 4]
    while tail and len("\n".join(tail)) > max_chars // 3:
        tail = tail[len(tail) // 4 + 1 :]
    left_out = len(lines) - len(head) - len(tail)
    chars_out = len(text) - len("\n".join(head)) - len("\n".join(tail))
    if left_out <= 0:
        cut = text[: max_chars * 2 // 3], text[-max_chars // 3 :]
        omitted = len(text) - sum(len(part) for part in cut)
        return f"{cut[0]}\n[... {omitted} characters clipped ...]\n{cut[1]}"
    marker = (
        f"[... {left_out} lines ({chars_out} characters) clipped: lines "
        f"{len(head) + 1}-{len(head) + left_out} of {len(lines)}; ask for a narrower range "
        f"or a more specific search to see them ...]"
    )
    return "\n".join([*head, marker, *tail])


def messages_tokens(messages: list[dict[str, Any]]) -> int:
    return tokens_estimate(messages)


def _prefix_length(messages: list[dict[str, Any]]) -> int:
    """System prompt, task and plan: everything up to the first assistant message."""
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            return index + 1
    return len(messages)


def _tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call.get("id", "")] = call.get("function", {}).get("name", "")
    return names


def _short_arguments(raw: str) -> str:
    if len(raw) <= ARGUMENT_KEEP_CHARS:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw[:ARGUMENT_KEEP_CHARS] + "…"
    if isinstance(value, dict):
        value = {
            k: (v[:120] + f"… ({len(v)} characters)" if isinstance(v, str) and len(v) > 120 else v)
            for k, v in value.items()
        }
    return json.dumps(value)


def _kept_results(messages: list[dict[str, Any]], names: dict[str, str]) -> set[int]:
    """Indexes of the latest edit results and the latest test result."""
    kept: set[int] = set()
    edits = 0
    test_seen = False
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "tool":
            continue
        name = names.get(message.get("tool_call_id", ""), "")
        if name in EDIT_TOOLS and edits < 3:
            kept.add(index)
            edits += 1
        elif name in TEST_TOOLS and not test_seen:
            kept.add(index)
            test_seen = True
    return kept


def context_condense(
    messages: list[dict[str, Any]], budget_tokens: int, *, keep_recent: int = KEEP_RECENT_MESSAGES
) -> list[dict[str, Any]]:
    """``messages`` fitted under ``budget_tokens`` (see the module docstring)."""
    if messages_tokens(messages) <= budget_tokens:
        return messages
    prefix = _prefix_length(messages)
    recent_start = max(prefix, len(messages) - keep_recent)
    # Never start the recent part on a tool result whose call would be condensed away.
    while recent_start > prefix and messages[recent_start].get("role") == "tool":
        recent_start -= 1
    names = _tool_names(messages)
    kept = _kept_results(messages, names)
    out = [dict(m) for m in messages]
    for index in range(prefix, recent_start):
        message = out[index]
        content = message.get("content") or ""
        if message.get("role") == "tool" and index not in kept:
            if not content.startswith(CONDENSED_PREFIX):
                name = names.get(message.get("tool_call_id", ""), "tool")
                first = content.splitlines()[0][:160] if content else ""
                message["content"] = (
                    f"{CONDENSED_PREFIX} output of {name} ({len(content.splitlines())} lines) "
                    f"removed to save context; call the tool again if you need it. "
                    f"It began: {first}"
                )
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": _short_arguments(call["function"].get("arguments", "")),
                    },
                }
                for call in message["tool_calls"]
            ]
            if len(content) > 1000:
                message["content"] = content[:1000] + "…"
    if messages_tokens(out) <= budget_tokens:
        return out
    return _drop_oldest(out, prefix, recent_start, budget_tokens, names)


def _drop_oldest(
    messages: list[dict[str, Any]],
    prefix: int,
    recent_start: int,
    budget_tokens: int,
    names: dict[str, str],
) -> list[dict[str, Any]]:
    """Drop whole turns from the oldest on, behind one note saying what they did."""
    head = messages[:prefix]
    middle = messages[prefix:recent_start]
    recent = messages[recent_start:]
    dropped_calls: list[str] = []
    earlier_note = ""
    if middle and (middle[0].get("content") or "").startswith(DROPPED_PREFIX):
        earlier_note = middle[0]["content"]
        middle = middle[1:]
    while middle:
        # One turn: an assistant message and the tool results (and notes) after it.
        end = 1
        while end < len(middle) and middle[end].get("role") != "assistant":
            end += 1
        for message in middle[:end]:
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                arguments = _short_arguments(function.get("arguments", ""))[:80]
                dropped_calls.append(f"{function.get('name', '')}({arguments})")
        middle = middle[end:]
        note = _drop_note(earlier_note, dropped_calls)
        if messages_tokens([*head, note, *middle, *recent]) <= budget_tokens:
            break
    note = _drop_note(earlier_note, dropped_calls)
    return [*head, note, *middle, *recent]


def _drop_note(earlier: str, calls: list[str]) -> dict[str, Any]:
    listed = "; ".join(calls[-40:])
    count = len(calls)
    previous = earlier[len(DROPPED_PREFIX) :].strip() if earlier else ""
    text = f"{DROPPED_PREFIX} {count} earlier tool calls were removed to save context: {listed}"
    if previous:
        text += f"\nBefore those: {previous[:1500]}"
    return {"role": "user", "content": text}


def context_budget(context_window: int, max_output_tokens: int, share: float, tools: Any) -> int:
    """Tokens the conversation may use: a share of the window less the reply and tools."""
    return max(1_000, int(context_window * share) - max_output_tokens - tokens_estimate(tools))
