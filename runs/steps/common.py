"""What several phases share: the run status enum, the working copy as the checkpoint
describes it, and the way back to running with feedback for the model."""

from __future__ import annotations

from typing import Any

from runs.agent.artifacts import redact
from runs.agent.budget import Spent, budget_exhausted, budget_used
from runs.agent.sandbox import CommandCancelled, LocalSandbox, SandboxError
from runs.agent.setup import SetupFailed, SetupResult, setup_ensure, setup_plan
from runs.agent.workspace import workspace_ensure, workspace_restore
from runs.models import Run
from runs.protocol import Outcome, RunCancelled, StepContext, StepFailed

S = Run.Status
OUTPUT_TAIL_CHARS = 2000


def test_command_of(ctx: StepContext) -> str:
    """The repository's test command, or the one detected for this run (preparing)."""
    detected = ctx.checkpoint.get("environment") or {}
    return ctx.repository.test_command.strip() or str(detected.get("test_command", ""))


def environment_failed(
    ctx: StepContext, reason: str, detail: str, *, stage: str, command: str, output: str = ""
) -> StepFailed:
    """The environment, not the agent, kept the tests from running: on the timeline with
    the output's tail; returns the failure that ends the run without spending attempts."""
    tail = redact(output[-OUTPUT_TAIL_CHARS:])
    ctx.emit(
        "agent.environment.failed",
        {"reason": reason, "stage": stage, "command": command, "output_tail": tail},
    )
    return StepFailed(reason, f"{detail}\n{tail}".strip())


def _setup(ctx: StepContext, sandbox: LocalSandbox, base: str = "") -> SetupResult | None:
    """The repository's setup mounted read-only into ``sandbox`` (made if not cached)."""
    plan = setup_plan(ctx.repository, ctx.checkpoint.get("environment"))
    try:
        result = setup_ensure(
            repository=ctx.repository,
            sandbox=sandbox,
            base_commit=base or ctx.run.base_commit,
            key=ctx.checkpoint.get("setup_key"),
            should_stop=ctx.should_stop,
            plan=plan,
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except SetupFailed as exc:
        detail = str(exc).split(":", 1)[0]
        if not plan.network:
            detail += "; it had no network (the repository's setup_network is off)"
        raise environment_failed(
            ctx,
            "setup_failed",
            detail,
            stage="setup",
            command=plan.command,
            output=exc.output or str(exc),
        ) from exc
    except SandboxError as exc:
        raise StepFailed("setup_failed", str(exc)) from exc
    if result is not None:
        ctx.checkpoint["setup_key"] = result.key
    return result


def _sandbox(ctx: StepContext) -> Any:
    try:
        sandbox = workspace_ensure(
            run=ctx.run,
            attempt=ctx.lease.attempt,
            diff=ctx.checkpoint.get("diff"),
            should_stop=ctx.should_stop,
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc
    _setup(ctx, sandbox)
    return sandbox


def _restore(ctx: StepContext) -> LocalSandbox:
    """The working copy exactly as the checkpoint describes it (see workspace_restore)."""
    try:
        sandbox = workspace_restore(
            run=ctx.run,
            attempt=ctx.lease.attempt,
            diff=ctx.checkpoint.get("diff"),
            should_stop=ctx.should_stop,
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc
    _setup(ctx, sandbox)
    return sandbox


def _retry_with_feedback(ctx: StepContext, *, reason: str, feedback: str) -> Outcome:
    """Back to running with ``feedback`` for the model, if the task has attempts left."""
    limit = ctx.task.budget_limit("agent_attempts")
    used = budget_used(task=ctx.task, run=ctx.run, name="agent_attempts")
    if used + 1 > limit:
        raise budget_exhausted(
            ctx,
            Spent("agent_attempts", used, limit),
            detail=f"{reason} after {used:g} of {limit:g} attempts",
        )
    ctx.checkpoint["attempt_no"] = int(ctx.checkpoint.get("attempt_no", 1)) + 1
    messages = list(ctx.checkpoint.get("messages", []))
    messages.append({"role": "user", "content": feedback})
    ctx.checkpoint["messages"] = messages
    ctx.checkpoint.pop("progress", None)
    ctx.emit(
        "agent.feedback.sent",
        {
            "reason": reason,
            "attempt_no": ctx.checkpoint["attempt_no"],
            "summary": redact(feedback[:500]),
        },
    )
    return Outcome(to=S.RUNNING, reason=reason)
