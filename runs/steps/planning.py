"""planning: a short plan from the model before it acts."""

from __future__ import annotations

from runs.agent.artifacts import artifact_create
from runs.agent.context import context_condense
from runs.agent.turns import profile_for, turn_obtain
from runs.protocol import Outcome, StepContext
from runs.steps.acting import window_for
from runs.steps.asking import PROCEED, input_wait, plan_record, plan_review_wanted
from runs.steps.common import S


def step_planning(ctx: StepContext) -> Outcome:
    messages = list(ctx.checkpoint["messages"])
    ask = [*messages, {"role": "user", "content": "Write a short plan before acting."}]
    profile = profile_for(ctx)
    # Only an oversized task or repository map can need this; the cut is deterministic.
    ask = context_condense(ask, window_for(profile, []).limit, model=profile.model)
    reply = turn_obtain(ctx, turn_no=0, purpose="plan", messages=ask, tools=[], turn_index=0)
    plan = artifact_create(run=ctx.run, kind="plan", name="plan", content=reply.content)
    ctx.emit("agent.plan.created", {"artifact_id": str(plan.id), "summary": reply.content[:300]})
    if plan_review_wanted(ctx):
        # A person accepts, edits or rejects it first (runs.steps.asking).
        plan_record(ctx, reply.content)
        return input_wait(ctx)
    # The conversation sent next must end with the user's turn: a trailing assistant
    # message is a prefill to Anthropic-style endpoints, which would continue the plan.
    messages.append({"role": "assistant", "content": f"Plan:\n{reply.content}"})
    messages.append({"role": "user", "content": PROCEED})
    ctx.checkpoint["messages"] = messages
    return Outcome(to=S.RUNNING)
