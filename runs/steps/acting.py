"""One acting turn with the conversation fitted to the model's window before it is sent."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from runs.agent.context import (
    TokenCounter,
    Window,
    context_condense,
    context_window_for,
    messages_canonical,
)
from runs.agent.profiles import ModelProfile
from runs.agent.tools import TOOL_SCHEMAS
from runs.agent.turns import turn_obtain
from runs.models import Run
from runs.protocol import StepContext, StepFailed
from runs.providers.base import ContextLengthExceeded, ModelReply

# Summary turns share the (run, step, turn) key space with acting turns.
SUMMARY_TURN_OFFSET = 1000
SUMMARY_PROMPT = (
    "You condense the earlier part of a coding agent's session so it can go on without "
    "it. Write at most 250 words: what was learned about the code (files, functions, "
    "line numbers), what was changed and how, test results, and what is still to do. "
    "Plain text, no preamble."
)


def window_for(profile: ModelProfile, tools: list[dict[str, Any]]) -> Window:
    return context_window_for(
        context_window=profile.context_window,
        max_output_tokens=profile.max_output_tokens,
        share=settings.CONTEXT_CONDENSE_AT,
        tools=tools,
        model=profile.model,
    )


def _summarizer(ctx: StepContext, profile: ModelProfile, turn_no: int) -> Any:
    """Summaries written by the model, as a checkpointed turn of their own: a resumed
    step replays the stored answer, so it condenses to the same text."""

    def summarize(dropped: list[dict[str, Any]], earlier: str) -> str:
        window = window_for(profile, [])
        transcript = "\n".join(
            f"{m.get('role')}: {m.get('content') or ''} "
            f"{json.dumps(m.get('tool_calls')) if m.get('tool_calls') else ''}".strip()
            for m in dropped
        )
        asked = [
            {"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": f"{earlier}\n\nSession so far:\n{transcript}".strip()},
        ]
        asked = context_condense(asked, window.limit // 2, model=profile.model)
        reply = turn_obtain(
            ctx,
            turn_no=SUMMARY_TURN_OFFSET + turn_no,
            purpose="summarize",
            messages=asked,
            tools=[],
            turn_index=turn_no,
        )
        return reply.content

    return summarize


def _fitted(
    ctx: StepContext, messages: list[dict[str, Any]], profile: ModelProfile, turn_no: int
) -> list[dict[str, Any]]:
    """The conversation to send, under the window; checkpointed when it changed."""
    window = window_for(profile, TOOL_SCHEMAS)
    counter = TokenCounter(profile.model)
    fitted = context_condense(
        messages,
        window.limit,
        trigger_tokens=window.trigger,
        target_tokens=window.target,
        model=profile.model,
        summarize=_summarizer(ctx, profile, turn_no) if profile.condense_summary else None,
    )
    if fitted is messages:
        return messages
    after = counter.messages(fitted)
    if after > window.limit:
        raise StepFailed(
            "context_exhausted",
            f"the newest turn alone needs {after} tokens; the window leaves {window.limit}",
        )
    ctx.emit(
        "agent.context.condensed",
        {
            "turn_no": turn_no,
            "messages_before": len(messages),
            "messages_after": len(fitted),
            "tokens_before": counter.messages(messages),
            "tokens_after": after,
            "limit": window.limit,
            "summary": profile.condense_summary,
        },
    )
    checkpoint_messages(ctx, fitted)
    return fitted


def checkpoint_messages(ctx: StepContext, messages: list[dict[str, Any]]) -> None:
    ctx.checkpoint["messages"] = messages
    with ctx.fenced():
        Run.objects.filter(pk=ctx.run.pk).update(checkpoint=ctx.checkpoint)


def act_turn(
    ctx: StepContext,
    *,
    turn_no: int,
    messages: list[dict[str, Any]],
    profile: ModelProfile,
    turn_index: int,
) -> tuple[ModelReply, list[dict[str, Any]]]:
    """One acting turn, with the conversation fitted to the window first.

    The fitted conversation is checkpointed before it is sent, so a resumed run sends
    the same. A refusal for length all the same (the endpoint counts differently)
    condenses to half and asks once more.
    """
    fitted = messages_canonical(_fitted(ctx, messages, profile, turn_no))
    try:
        reply = turn_obtain(
            ctx,
            turn_no=turn_no,
            purpose="act",
            messages=fitted,
            tools=TOOL_SCHEMAS,
            turn_index=turn_index,
            condense_on_refusal=True,
        )
        return reply, fitted
    except ContextLengthExceeded as exc:
        # The endpoint knows better than our estimate: aim well below what was refused.
        # Counted the same way for every model, so a recorded run replayed through
        # another profile condenses to the very request the recording holds.
        target = TokenCounter().messages(fitted) // 2
        smaller = context_condense(fitted, target)
        if smaller == fitted:
            raise StepFailed("context_exhausted", str(exc)) from exc
        ctx.emit(
            "agent.context.condensed",
            {
                "turn_no": turn_no,
                "messages_before": len(fitted),
                "messages_after": len(smaller),
                "reason": "context_length_exceeded",
            },
        )
        checkpoint_messages(ctx, smaller)
        smaller = messages_canonical(smaller)
    try:
        reply = turn_obtain(
            ctx,
            turn_no=turn_no,
            purpose="act",
            messages=smaller,
            tools=TOOL_SCHEMAS,
            turn_index=turn_index,
        )
    except ContextLengthExceeded as exc:
        raise StepFailed("context_exhausted", str(exc)) from exc
    return reply, smaller
