"""Model turns, checkpointed: a turn answered once is never asked again.

The key is (run, step_no, turn_no). A step that crashed re-executes with the same step
number, finds the turns it already paid for and replays them instead of calling the
model.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import F

from runs.agent.artifacts import artifact_create
from runs.agent.budget import budget_enforce
from runs.engine import StepContext, StepFailed, TransientStepError
from runs.models import ModelTurn, Run
from runs.providers import ModelReply, provider_for
from runs.providers.base import ModelError

# USD per million tokens (input, output); unknown models cost what the default says.
PRICE_TABLE: dict[str, tuple[Decimal, Decimal]] = {
    "scripted-1": (Decimal("0.50"), Decimal("1.50")),
    "gpt-4o": (Decimal("2.50"), Decimal("10.00")),
    "gpt-4o-mini": (Decimal("0.15"), Decimal("0.60")),
    "gpt-4.1": (Decimal("2.00"), Decimal("8.00")),
    "gpt-4.1-mini": (Decimal("0.40"), Decimal("1.60")),
    "default": (Decimal("1.00"), Decimal("3.00")),
}


def turn_cost(model: str, tokens_in: int, tokens_out: int) -> Decimal:
    price_in, price_out = PRICE_TABLE.get(model, PRICE_TABLE["default"])
    return (price_in * tokens_in + price_out * tokens_out) / Decimal(1_000_000)


def model_profile(ctx: StepContext) -> str:
    return ctx.task.model_options.get("provider") or settings.AGENT_MODEL


def turn_obtain(
    ctx: StepContext,
    *,
    turn_no: int,
    purpose: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    turn_index: int,
) -> ModelReply:
    """The model's answer for this turn: from the checkpoint if answered, else asked now.

    An answer is committed (turn row, usage, artifacts, event) the moment it arrives and
    before any tool acts on it, so a worker that dies afterwards costs no second call.
    """
    existing = ModelTurn.objects.filter(run=ctx.run, step_no=ctx.step_no, turn_no=turn_no).first()
    if existing is not None:
        return ModelReply.from_json(existing.response)
    budget_enforce(ctx, "wall_clock_seconds", "cost_usd")
    budget_enforce(ctx, "model_turns", headroom=1)
    ctx.check_cancelled()
    options = {**ctx.task.model_options, "run_no": ctx.run.run_no}
    provider = provider_for(model_profile(ctx), options=options)
    started = time.monotonic()
    try:
        reply = provider.complete(
            messages=messages, tools=tools, purpose=purpose, turn_index=turn_index
        )
    except ModelError as exc:
        if exc.retryable:
            raise TransientStepError(str(exc)) from exc
        raise StepFailed("model_error", str(exc)) from exc
    latency_ms = int((time.monotonic() - started) * 1000)
    model = reply.model or provider.model
    cost = turn_cost(model, reply.usage.tokens_in, reply.usage.tokens_out)
    with ctx.fenced():
        request = artifact_create(
            run=ctx.run,
            kind="model_request",
            name=f"turn {ctx.step_no}.{turn_no} request",
            content=json.dumps(
                {
                    "model": model,
                    "purpose": purpose,
                    "messages": messages,
                    "tools": [t["function"]["name"] for t in tools],
                },
                indent=1,
            ),
            content_type="application/json",
        )
        response = artifact_create(
            run=ctx.run,
            kind="model_response",
            name=f"turn {ctx.step_no}.{turn_no} response",
            content=json.dumps(reply.raw or reply.to_json(), indent=1),
            content_type="application/json",
        )
        ModelTurn.objects.create(
            run=ctx.run,
            step_no=ctx.step_no,
            turn_no=turn_no,
            purpose=purpose,
            provider=provider.name,
            model=model,
            response=reply.to_json(),
            tokens_in=reply.usage.tokens_in,
            tokens_out=reply.usage.tokens_out,
            cost_usd=cost,
            latency_ms=latency_ms,
            request_artifact=request,
            response_artifact=response,
        )
        Run.objects.filter(pk=ctx.run.pk).update(
            tokens_in=F("tokens_in") + reply.usage.tokens_in,
            tokens_out=F("tokens_out") + reply.usage.tokens_out,
            cost_usd=F("cost_usd") + cost,
            model_profile=f"{provider.name}:{model}",
        )
        ctx.emit(
            "agent.model.turn.completed",
            {
                "step_no": ctx.step_no,
                "turn_no": turn_no,
                "purpose": purpose,
                "model": model,
                "tokens_in": reply.usage.tokens_in,
                "tokens_out": reply.usage.tokens_out,
                "cost_usd": str(cost),
                "latency_ms": latency_ms,
                "tool_calls": [c.name for c in reply.tool_calls],
                "request_artifact_id": str(request.id),
                "response_artifact_id": str(response.id),
            },
        )
    ctx.run.cost_usd += cost
    return reply
