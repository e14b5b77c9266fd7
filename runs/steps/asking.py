"""Waiting for a person: a question the model asked (``ask_user``) or a plan under review.

The step that asks checkpoints what it waits for (``input_pending``) and moves the run to
``awaiting_input``; the question's row and ``agent.run.input.requested`` are written by
that step's commit, so a step that crashed before it asks again from its checkpoint and
nothing is recorded twice. No lease is held while the run waits. An answer (runs.waiting)
wakes the run; ``step_awaiting_input`` puts the answer where the model will read it and
goes back to running: the turns already taken are checkpointed, none is asked again.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.agent.artifacts import artifact_create, redact
from runs.agent.asking import ASKED, answer_text
from runs.models import Artifact, InputRequest, Run
from runs.protocol import Outcome, StepContext
from runs.waiting import input_notify_enqueue

S = Run.Status
PROCEED = "Carry out the plan with the tools; call finish when the task is done."


def ask_record(ctx: StepContext, *, turn_no: int, call_id: str, arguments: dict[str, Any]) -> None:
    """Remember in the checkpoint that the model's call ``call_id`` waits for a person."""
    question = str(arguments.get("question") or "").strip()
    choices = [str(c).strip() for c in (arguments.get("choices") or []) if str(c).strip()]
    ctx.checkpoint["input_pending"] = {
        "id": str(uuid.uuid4()),
        "key": f"{ctx.step_no}:{turn_no}:{call_id}",
        "kind": InputRequest.Kind.QUESTION,
        "question": question,
        "choices": choices,
        "call_id": call_id,
    }


def plan_review_wanted(ctx: StepContext) -> bool:
    """The task's own policy if it has one, else its repository's."""
    wanted = ctx.task.plan_review
    return bool(ctx.repository.plan_review if wanted is None else wanted)


def plan_record(ctx: StepContext, plan: str) -> None:
    ctx.checkpoint["input_pending"] = {
        "id": str(uuid.uuid4()),
        "key": "plan",
        "kind": InputRequest.Kind.PLAN,
        "question": plan,
        "choices": [choice.value for choice in InputRequest.Decision],
        "call_id": "",
    }


def input_wait(ctx: StepContext) -> Outcome:
    """Move to ``awaiting_input`` for the checkpoint's pending question; its row, event
    and notification are written by this step's commit (once: a row already there was
    written by an earlier commit of the same question)."""
    pending = ctx.checkpoint["input_pending"]
    if not InputRequest.objects.filter(run=ctx.run, key=pending["key"]).exists():
        ttl = timedelta(seconds=settings.INPUT_TTL_SECONDS)
        run, task = ctx.run, ctx.task

        def record() -> None:
            now = timezone.now()
            request = InputRequest.objects.create(
                id=pending["id"],
                run=run,
                key=pending["key"],
                kind=pending["kind"],
                question=pending["question"],
                choices=pending["choices"],
                call_id=pending["call_id"],
                requested_at=now,
                expires_at=now + ttl,
            )
            input_notify_enqueue(task=task, request=request)

        ctx.write_on_commit(record)
        ctx.emit(
            "agent.run.input.requested",
            {
                "question_id": pending["id"],
                "kind": pending["kind"],
                "question": redact(pending["question"][:2000]),
                "choices": pending["choices"],
                "expires_at": (timezone.now() + ttl).isoformat(),
            },
        )
    return Outcome(to=S.AWAITING_INPUT, wait=True, reason=f"{pending['kind']}_asked")


def step_awaiting_input(ctx: StepContext) -> Outcome:
    """Act on the answer recorded by runs.waiting; wait while there is none."""
    pending = ctx.checkpoint.get("input_pending") or {}
    request = InputRequest.objects.filter(run=ctx.run, key=pending.get("key", "")).first()
    if request is None or request.status in (InputRequest.Status.PENDING, InputRequest.Status.VOID):
        return Outcome(noop=True)
    if request.status == InputRequest.Status.EXPIRED:
        return Outcome(
            to=S.TIMED_OUT,
            reason="input_expired",
            detail=f"nobody answered within {settings.INPUT_TTL_SECONDS} s: "
            f"{request.question[:300]}",
        )
    ctx.checkpoint.pop("input_pending", None)
    if request.kind == InputRequest.Kind.PLAN:
        return _plan_decided(ctx, request)
    messages = list(ctx.checkpoint.get("messages", []))
    for message in messages:
        if (
            message.get("role") == "tool"
            and message.get("tool_call_id") == request.call_id
            and message.get("content") == ASKED
        ):
            message["content"] = answer_text(request.answer, by=request.answered_by)
    ctx.checkpoint["messages"] = messages
    return Outcome(to=S.RUNNING, reason="input_answered")


def _plan_decided(ctx: StepContext, request: InputRequest) -> Outcome:
    if request.decision == InputRequest.Decision.REJECT:
        return Outcome(
            to=S.FAILED,
            reason="plan_rejected",
            detail=f"the plan was rejected by {request.answered_by}"
            + (f": {request.answer}" if request.answer else ""),
        )
    plan = request.question
    if request.decision == InputRequest.Decision.EDIT:
        plan = request.answer
        # Once, even if this step runs again after a crash.
        artifact = Artifact.objects.filter(
            run=ctx.run, kind="plan", name="plan (edited)"
        ).first() or artifact_create(run=ctx.run, kind="plan", name="plan (edited)", content=plan)
        ctx.emit(
            "agent.plan.created",
            {
                "artifact_id": str(artifact.id),
                "summary": plan[:300],
                "edited_by": request.answered_by,
            },
        )
    messages = list(ctx.checkpoint.get("messages", []))
    # The conversation ends with the user's turn (see runs.steps.planning).
    messages.append({"role": "assistant", "content": f"Plan:\n{plan}"})
    messages.append({"role": "user", "content": PROCEED})
    ctx.checkpoint["messages"] = messages
    reason = "plan_edited" if request.decision == InputRequest.Decision.EDIT else "plan_accepted"
    return Outcome(to=S.RUNNING, reason=reason)
