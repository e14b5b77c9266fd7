"""Model turns, checkpointed: a turn answered once is never asked again.

The key is (run, step_no, turn_no). A step that crashed re-executes with the same step
number, finds the turns it already paid for and replays them instead of calling the
model.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from django.db.models import F

from runs.agent.artifacts import artifact_create
from runs.agent.budget import budget_enforce
from runs.agent.profiles import (
    ModelProfile,
    ProfileError,
    profile_get,
    profile_name_for,
)
from runs.agent.tools import tool_call_problem
from runs.agent.waits import connections_release_for_wait
from runs.logs import log
from runs.models import ModelTurn, Run
from runs.protocol import LeaseLost, StepContext, StepFailed, TransientStepError
from runs.providers import ModelReply, provider_for_profile
from runs.providers.base import (
    ContextLengthExceeded,
    ModelError,
    ProviderObserver,
    ReplayDiverged,
    RetryNotice,
    StreamProgress,
)
from runs.ratelimits import Wait
from runs.spend import workspace_spend_add

PROBLEM_EVENT = "agent.model.error"
RETRIED_EVENT = "agent.model.request.retried"
THROTTLED_EVENT = "agent.model.request.throttled"
FAILED_EVENT = "agent.model.request.failed"
PROGRESS_EVENT = "agent.model.stream.progress"


def model_profile(ctx: StepContext) -> str:
    return profile_name_for(ctx.task)


def profile_for(ctx: StepContext) -> ModelProfile:
    try:
        return profile_get(model_profile(ctx))
    except ProfileError as exc:
        raise StepFailed("model_profile_unknown", str(exc)) from exc


def _record_now(ctx: StepContext, type: str, data: dict[str, Any]) -> None:
    """Put one event on the timeline at once, while the call it reports is still going.

    Only this event is committed: what the step buffered so far belongs to the step's
    own commit (its rows are not written yet).
    """
    buffered, ctx.events = ctx.events, []
    try:
        ctx.emit(type, data)
        with ctx.fenced():
            pass
    finally:
        ctx.events = buffered + ctx.events


def _observer(ctx: StepContext, *, turn_no: int, purpose: str) -> ProviderObserver:
    where = {"step_no": ctx.step_no, "turn_no": turn_no, "purpose": purpose}

    def retried(notice: RetryNotice) -> None:
        _record_now(
            ctx,
            RETRIED_EVENT,
            {
                **where,
                "attempt": notice.attempt,
                "status": notice.status,
                "error": notice.error,
                "wait_seconds": notice.wait_seconds,
                "retry_after": notice.retry_after,
            },
        )

    def progressed(progress: StreamProgress) -> None:
        _record_now(
            ctx,
            PROGRESS_EVENT,
            {
                **where,
                "chunks": progress.chunks,
                "chars": progress.chars,
                "elapsed_ms": progress.elapsed_ms,
            },
        )

    def throttled(wait: Wait) -> None:
        _record_now(
            ctx,
            THROTTLED_EVENT,
            {**where, "limit": wait.limit, "wait_seconds": round(wait.wait_seconds, 3)},
        )

    return ProviderObserver(retry=retried, progress=progressed, rate_wait=throttled)


def _failed(ctx: StepContext, exc: ModelError, *, turn_no: int, purpose: str) -> dict[str, Any]:
    return {
        "step_no": ctx.step_no,
        "turn_no": turn_no,
        "purpose": purpose,
        "status": exc.status,
        "error": str(exc)[:2000],
        "retryable": exc.retryable,
        "attempts": exc.attempts,
    }


def reply_problem(reply: ModelReply, tools: list[dict[str, Any]], purpose: str) -> str:
    """What is wrong with an acting turn's reply, or "" (see the model_errors budget)."""
    if purpose != "act" or not tools:
        return ""
    if reply.finish_reason == "length":
        return "length"
    if any(tool_call_problem(c.name, c.arguments, c.error, tools) for c in reply.tool_calls):
        return "invalid_tool_call"
    if not reply.tool_calls:
        return "text_only"
    return ""


# How long an answered turn's commit waits between tries while the database refuses it.
CHECKPOINT_RETRY_SECONDS = 0.2
CHECKPOINT_RETRY_MAX_SECONDS = 2.0


def _answer_checkpoint(ctx: StepContext, write: Callable[[], None], *, turn_no: int) -> None:
    """Commit an answered turn (``write``, in ``ctx.fenced()``), again after a lost or
    refused database connection (an exhausted pool, a restart) for as long as the step's
    lease holds: the answer is paid for, and a step that gave up here would ask the model
    the same turn again. A lease that became uncertain ends the tries (LeaseLost): from
    then on the run is the reaper's to hand on, and this worker writes nothing.

    A commit whose acknowledgement was lost on the way back has landed: the turn's row
    is there, and it is not written twice.
    """
    delay = CHECKPOINT_RETRY_SECONDS
    tried = False
    while True:
        buffered = list(ctx.events)
        try:
            with ctx.fenced():
                if (
                    tried
                    and ModelTurn.objects.filter(
                        run=ctx.run, step_no=ctx.step_no, turn_no=turn_no
                    ).exists()
                ):
                    ctx.events = []  # flushed by the commit that landed
                    return
                write()
            return
        except (OperationalError, InterfaceError) as exc:
            ctx.events = buffered
            with contextlib.suppress(Exception):
                connection.close()
            if ctx.heartbeat is None:
                raise
            if ctx.heartbeat.lost:
                raise LeaseLost(
                    f"lease on run {ctx.run.id} uncertain before its turn was kept"
                ) from exc
            log.warning(
                "model.turn_checkpoint_retried",
                run_id=str(ctx.run.id),
                step_no=ctx.step_no,
                turn_no=turn_no,
                exc_info=True,
            )
            tried = True
            time.sleep(delay)
            delay = min(delay * 2, CHECKPOINT_RETRY_MAX_SECONDS)


def turn_obtain(
    ctx: StepContext,
    *,
    turn_no: int,
    purpose: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    turn_index: int,
    condense_on_refusal: bool = False,
) -> ModelReply:
    """The model's answer for this turn: from the checkpoint if answered, else asked now.

    An answer is committed (turn row, usage, artifacts, event) the moment it arrives and
    before any tool acts on it, so a worker that dies afterwards costs no second call.
    Every paid reply is stored and counted, including one the model got wrong; those
    carry a ``problem`` and count against the ``model_errors`` budget. A refusal for
    length raises ContextLengthExceeded for a caller that can condense
    (``condense_on_refusal``) and fails with ``context_exhausted`` otherwise.
    """
    existing = ModelTurn.objects.filter(run=ctx.run, step_no=ctx.step_no, turn_no=turn_no).first()
    if existing is not None:
        return ModelReply.from_json(existing.response)
    budget_enforce(ctx, "wall_clock_seconds", "cost_usd")
    budget_enforce(ctx, "model_turns", headroom=1)
    ctx.check_cancelled()
    options = {**ctx.task.model_options, "run_no": ctx.run.run_no}
    profile = profile_for(ctx)
    provider = provider_for_profile(
        profile,
        options=options,
        turn_key=f"{ctx.run.pk}:{ctx.step_no}:{turn_no}",
        observer=_observer(ctx, turn_no=turn_no, purpose=purpose),
    )
    connections_release_for_wait()
    started = time.monotonic()
    reply = _ask(
        ctx,
        provider,
        turn_no=turn_no,
        purpose=purpose,
        messages=messages,
        tools=tools,
        turn_index=turn_index,
        condense_on_refusal=condense_on_refusal,
    )
    answered = _Answered(
        turn_no=turn_no,
        purpose=purpose,
        profile=profile,
        provider_name=provider.name,
        model=reply.model or provider.model,
        reply=reply,
        latency_ms=int((time.monotonic() - started) * 1000),
        problem=reply_problem(reply, tools, purpose),
    )
    _answer_checkpoint(ctx, lambda: _checkpoint(ctx, answered, messages, tools), turn_no=turn_no)
    ctx.run.cost_usd += answered.cost
    if answered.problem:
        # The reply that reaches the limit is the last one paid for: with a limit of 8,
        # the 8th bad reply ends the run rather than buying a 9th.
        budget_enforce(ctx, "model_errors", headroom=1)
    return reply


def _ask(
    ctx: StepContext,
    provider: Any,
    *,
    turn_no: int,
    purpose: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    turn_index: int,
    condense_on_refusal: bool,
) -> ModelReply:
    """The provider's reply, or the step's end: a refusal for length (raised on for a
    caller that condenses), a diverged replay, a retryable error (the step is retried)
    or a permanent one."""
    try:
        return provider.complete(  # type: ignore[no-any-return]
            messages=messages, tools=tools, purpose=purpose, turn_index=turn_index
        )
    except ContextLengthExceeded as exc:
        if condense_on_refusal:
            raise
        ctx.emit(FAILED_EVENT, _failed(ctx, exc, turn_no=turn_no, purpose=purpose))
        raise StepFailed("context_exhausted", str(exc)) from exc
    except ReplayDiverged as exc:
        raise StepFailed("replay_diverged", str(exc)) from exc
    except ModelError as exc:
        if exc.retryable:
            # The step is rolled back and retried: the event is committed on its own.
            _record_now(ctx, FAILED_EVENT, _failed(ctx, exc, turn_no=turn_no, purpose=purpose))
            raise TransientStepError(str(exc)) from exc
        ctx.emit(FAILED_EVENT, _failed(ctx, exc, turn_no=turn_no, purpose=purpose))
        raise StepFailed("model_error", str(exc)) from exc


@dataclass(frozen=True)
class _Answered:
    """A paid reply and what its checkpoint records about it."""

    turn_no: int
    purpose: str
    profile: ModelProfile
    provider_name: str
    model: str
    reply: ModelReply
    latency_ms: int
    problem: str

    @property
    def cost(self) -> Decimal:
        usage = self.reply.usage
        return self.profile.for_model(self.model).cost(
            usage.tokens_in, usage.tokens_out, usage.tokens_cached
        )


def _checkpoint(
    ctx: StepContext,
    answered: _Answered,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> None:
    """Write the answered turn: its request and response artifacts, the turn row, the
    run's and workspace's usage, and its events."""
    reply, model, profile = answered.reply, answered.model, answered.profile
    turn_no, purpose, problem = answered.turn_no, answered.purpose, answered.problem
    usage, cost, latency_ms = reply.usage, answered.cost, answered.latency_ms
    request = artifact_create(
        run=ctx.run,
        kind="model_request",
        name=f"turn {ctx.step_no}.{turn_no} request",
        content=json.dumps(
            {
                "model": model,
                "profile": profile.name,
                "purpose": purpose,
                "messages": messages,
                "tools": [t["function"]["name"] for t in tools],
                "max_tokens": profile.max_output_tokens,
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
        provider=answered.provider_name,
        model=model,
        response=reply.to_json(),
        tokens_in=reply.usage.tokens_in,
        tokens_out=reply.usage.tokens_out,
        tokens_cached=usage.tokens_cached,
        usage_estimated=usage.estimated,
        finish_reason=reply.finish_reason[:32],
        problem=problem,
        cost_usd=cost,
        latency_ms=latency_ms,
        request_artifact=request,
        response_artifact=response,
    )
    Run.objects.filter(pk=ctx.run.pk).update(
        tokens_in=F("tokens_in") + reply.usage.tokens_in,
        tokens_out=F("tokens_out") + reply.usage.tokens_out,
        cost_usd=F("cost_usd") + cost,
        model_profile=f"{profile.name}:{model}"[:200],
    )
    workspace_spend_add(workspace_id=ctx.task.workspace_id, cost=cost)
    _checkpoint_events(ctx, answered, request_id=str(request.id), response_id=str(response.id))


def _checkpoint_events(
    ctx: StepContext, answered: _Answered, *, request_id: str, response_id: str
) -> None:
    """The answered turn's events: its completion, and its problem if the reply had one."""
    reply, model, problem, turn_no = (
        answered.reply,
        answered.model,
        answered.problem,
        answered.turn_no,
    )
    usage = reply.usage
    ctx.emit(
        "agent.model.turn.completed",
        {
            "step_no": ctx.step_no,
            "turn_no": turn_no,
            "purpose": answered.purpose,
            "model": model,
            "tokens_in": reply.usage.tokens_in,
            "tokens_out": reply.usage.tokens_out,
            "cost_usd": str(answered.cost),
            "latency_ms": answered.latency_ms,
            "tool_calls": [c.name for c in reply.tool_calls],
            "request_artifact_id": request_id,
            "response_artifact_id": response_id,
            "finish_reason": reply.finish_reason,
            "usage_estimated": usage.estimated,
            "problem": problem,
            **({"reasoning_chars": len(reply.reasoning)} if reply.reasoning else {}),
        },
    )
    if problem:
        ctx.emit(
            PROBLEM_EVENT,
            {
                "step_no": ctx.step_no,
                "turn_no": turn_no,
                "problem": problem,
                "finish_reason": reply.finish_reason,
                "tool_calls": [c.name[:64] for c in reply.tool_calls],
            },
        )
