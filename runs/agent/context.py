"""The conversation kept within the model's context window, before it is sent.

Tool outputs are clipped when they are produced (a visible marker says what was left
out and how to see it). Every acting request is then fitted to the window: the
profile's context window less its output cap and the tool schemas. Tokens are counted
with the model's tokenizer where it is known (OpenAI's vocabularies ship with
bpe-openai) and with o200k plus a quarter otherwise, a safe over-estimate for the
open-weight vocabularies; each message is counted as the JSON it travels as, which is
more than a server counts for it.

When the conversation is over the condensing threshold it is fitted to a lower target,
so it is not condensed again at the very next turn (which would also defeat prompt
caches), in this order until it fits:

1. observation masking: from the oldest turn on, a tool output is replaced by a
   one-line placeholder (its arguments shortened, long assistant text cut); the
   newest outputs stay whole as long as they fit;
2. the oldest masked turns are dropped whole (a call and its result go together, as
   the protocol requires) behind ONE note that says what they did, or, when the
   profile asks for it, a summary the model wrote of them;
3. a single huge output of the newest turn, and last any oversized message, is cut to
   its head and tail.

Condensing is a pure function of the messages, the limits and (for the summary) a
checkpointed model turn; the running step checkpoints its result before sending it, so
a resumed run sends exactly the request the original would have.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runs.agent.profiles import tokens_estimate

CONDENSED_PREFIX = "[condensed]"
DROPPED_PREFIX = "[earlier turns condensed]"
ARGUMENT_KEEP_CHARS = 300
ASSISTANT_KEEP_CHARS = 600
NOTE_MAX_CHARS = 2_400
# Tokens kept free for what the counting cannot see: the chat template's framing.
FRAMING_RESERVE = 64
PER_MESSAGE_TOKENS = 4
UNKNOWN_TOKENIZER_FACTOR = 1.25
# After condensing, the conversation aims at this share of the threshold.
CONDENSE_TARGET_SHARE = 0.7

# What produces a summary of dropped turns: (messages to summarize, earlier note) -> text.
Summarizer = Callable[[list[dict[str, Any]], str], str]


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


@functools.lru_cache(maxsize=64)
def tokenizer_known(model: str) -> bool:
    """Whether bpe-openai has this model's own vocabulary (else o200k stands in)."""
    import bpe_openai

    try:
        bpe_openai.encoding_name_for_model(model.split("/", 1)[-1])
    except (bpe_openai.UnsupportedModelError, ValueError, KeyError):
        return False
    return True


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens for one model, message by message (memoized by content)."""

    model: str = ""

    @functools.cached_property
    def factor(self) -> float:
        return 1.0 if self.model and tokenizer_known(self.model) else UNKNOWN_TOKENIZER_FACTOR

    def message(self, message: dict[str, Any]) -> int:
        return _message_tokens(json.dumps(message, sort_keys=True), self.model, self.factor)

    def messages(self, messages: list[dict[str, Any]]) -> int:
        return sum(self.message(m) for m in messages)

    def payload(self, payload: Any) -> int:
        return int(tokens_estimate(payload, model=self.model) * self.factor) + 1


# Keyed by the message's text: a conversation is counted again at every turn, and
# all but the newest messages are unchanged. Clipped outputs keep entries small.
@functools.lru_cache(maxsize=2048)
def _message_tokens(text: str, model: str, factor: float) -> int:
    return int(tokens_estimate(text, model=model) * factor) + PER_MESSAGE_TOKENS


def messages_canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every object's keys sorted: the checkpoint (jsonb) reorders
    keys, so a request built from it is byte-identical only in a canonical order."""
    return [_sorted(m) for m in messages]


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def messages_tokens(messages: list[dict[str, Any]], *, model: str = "") -> int:
    return TokenCounter(model).messages(messages)


def context_limit(
    *, context_window: int, max_output_tokens: int, tools: Any, model: str = ""
) -> int:
    """The most tokens the messages may take: the window less the reply and the tools."""
    tools_tokens = TokenCounter(model).payload(tools) if tools else 0
    return context_window - max_output_tokens - tools_tokens - FRAMING_RESERVE


@dataclass(frozen=True)
class Window:
    """What a request may carry: ``limit`` never to pass, ``trigger`` to start
    condensing at, ``target`` to condense down to."""

    limit: int
    trigger: int
    target: int


def context_window_for(
    *, context_window: int, max_output_tokens: int, share: float, tools: Any, model: str = ""
) -> Window:
    limit = context_limit(
        context_window=context_window,
        max_output_tokens=max_output_tokens,
        tools=tools,
        model=model,
    )
    trigger = max(min(limit, 1_000), int(limit * share))
    return Window(limit, trigger, int(trigger * CONDENSE_TARGET_SHARE))


def _prefix_length(messages: list[dict[str, Any]]) -> int:
    """System prompt, task and plan: everything up to the first assistant message."""
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            return index + 1
    return len(messages)


def _turns(messages: list[dict[str, Any]], start: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans from ``start`` on: an assistant message with the tool
    results after it, or a lone user message (a note or feedback)."""
    spans: list[tuple[int, int]] = []
    index = start
    while index < len(messages):
        end = index + 1
        if messages[index].get("role") == "assistant":
            while end < len(messages) and messages[end].get("role") == "tool":
                end += 1
        spans.append((index, end))
        index = end
    return spans


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


def _masked(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """``message`` with its bulk replaced: a tool output by a placeholder, a call's
    arguments shortened, long text cut. Masking a masked message changes nothing."""
    content = message.get("content") or ""
    role = message.get("role")
    if role == "tool":
        if content.startswith(CONDENSED_PREFIX):
            return message
        name = names.get(message.get("tool_call_id", ""), "tool")
        first = content.splitlines()[0][:120] if content else ""
        return {
            **message,
            "content": f"{CONDENSED_PREFIX} output of {name} ({len(content.splitlines())} "
            f"lines) omitted to save context; call the tool again if you need it. "
            f"It began: {first}",
        }
    changed = dict(message)
    if message.get("tool_calls"):
        changed["tool_calls"] = [
            {
                **call,
                "function": {
                    **call["function"],
                    "arguments": _short_arguments(call["function"].get("arguments", "")),
                },
            }
            for call in message["tool_calls"]
        ]
    if len(content) > ASSISTANT_KEEP_CHARS:
        changed["content"] = content[:ASSISTANT_KEEP_CHARS] + "…"
    return changed


def _calls_listed(messages: list[dict[str, Any]]) -> list[str]:
    listed: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            arguments = _short_arguments(function.get("arguments", ""))[:80]
            listed.append(f"{function.get('name', '')}({arguments})")
        if message.get("role") == "user":
            listed.append(f"note: {(message.get('content') or '')[:120]}")
    return listed


def _note(dropped: list[dict[str, Any]], earlier: str, summary: str = "") -> dict[str, Any]:
    """The one note that stands for every dropped turn (the earlier note folded in)."""
    previous = earlier[len(DROPPED_PREFIX) :].strip() if earlier else ""
    if summary:
        body = f"Summary of the earlier work:\n{summary.strip()}"
    else:
        calls = _calls_listed(dropped)
        body = f"{len(calls)} earlier tool calls and notes were removed: " + "; ".join(calls[-30:])
        if previous:
            body += f"\nBefore those: {previous}"
    text = f"{DROPPED_PREFIX} {body}"
    if len(text) > NOTE_MAX_CHARS:
        text = text[: NOTE_MAX_CHARS // 3] + " … " + text[-(NOTE_MAX_CHARS * 2 // 3) :]
    return {"role": "user", "content": text}


def _cut(text: str, tokens: int, counter: TokenCounter) -> str:
    """``text`` cut to its head and tail so that it takes at most about ``tokens``."""
    have = counter.payload(text)
    if have <= tokens:
        return text
    keep = max(200, int(len(text) * tokens / have * 0.9))
    return clip(text, max_chars=keep, max_lines=max(20, keep // 40))


def context_condense(
    messages: list[dict[str, Any]],
    budget_tokens: int,
    *,
    trigger_tokens: int | None = None,
    target_tokens: int | None = None,
    model: str = "",
    summarize: Summarizer | None = None,
) -> list[dict[str, Any]]:
    """``messages`` fitted under ``budget_tokens`` (see the module docstring).

    Unchanged (the same list) while they take at most ``trigger_tokens`` (default: the
    budget); otherwise condensed to at most ``target_tokens`` where masking and
    dropping can get there, and never over ``budget_tokens``: what still does not fit
    is cut.
    """
    counter = TokenCounter(model)
    trigger = min(budget_tokens, trigger_tokens or budget_tokens)
    if counter.messages(messages) <= trigger:
        return messages
    target = min(budget_tokens, target_tokens or budget_tokens)
    prefix = _prefix_length(messages)
    spans = _turns(messages, prefix)
    newest = spans[-1][0] if spans else len(messages)
    names = _tool_names(messages)
    out = list(messages)
    total = counter.messages(out)
    # 1. Mask from the oldest turn on; the newest turn stays whole.
    for index in range(prefix, newest):
        if total <= target:
            return out
        masked = _masked(out[index], names)
        total += counter.message(masked) - counter.message(out[index])
        out[index] = masked
    if total <= target:
        return out
    out = _drop_oldest(out, prefix, newest, target, counter, summarize)
    return _cut_to_fit(out, budget_tokens, counter)


def _drop_oldest(
    messages: list[dict[str, Any]],
    prefix: int,
    newest: int,
    target: int,
    counter: TokenCounter,
    summarize: Summarizer | None,
) -> list[dict[str, Any]]:
    """Drop whole turns, oldest first, behind one note; the newest turn stays."""
    head, middle, recent = messages[:prefix], messages[prefix:newest], messages[newest:]
    earlier = ""
    if middle and (middle[0].get("content") or "").startswith(DROPPED_PREFIX):
        earlier, middle = middle[0]["content"], middle[1:]
    dropped: list[dict[str, Any]] = []
    fixed = counter.messages(head) + counter.messages(recent)
    # The note is sized at its cap, so a summary written later cannot overshoot.
    note_room = int(NOTE_MAX_CHARS / 2.5 * counter.factor) + PER_MESSAGE_TOKENS
    while middle and fixed + note_room + counter.messages(middle) > target:
        spans = _turns(middle, 0)
        _, end = spans[0]
        dropped.extend(middle[:end])
        middle = middle[end:]
    if not dropped:
        return messages
    summary = summarize(dropped, earlier) if summarize else ""
    return [*head, _note(dropped, earlier, summary), *middle, *recent]


def _cut_to_fit(
    messages: list[dict[str, Any]], budget: int, counter: TokenCounter
) -> list[dict[str, Any]]:
    """Cut the largest messages' content to head and tail until the whole fits."""
    out = list(messages)
    for _ in range(len(out) * 2):
        total = counter.messages(out)
        if total <= budget:
            return out
        index = max(range(len(out)), key=lambda i: counter.message(out[i]))
        message = out[index]
        content = message.get("content") or ""
        size = counter.message(message)
        if not content or size <= 200:
            break
        room = max(100, size - (total - budget) - 50)
        out[index] = {**message, "content": _cut(content, room, counter)}
        if counter.message(out[index]) >= size:
            break
    return out
