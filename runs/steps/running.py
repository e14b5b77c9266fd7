"""running: model turns with tools, then the finished attempt's patch."""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.agent.artifacts import artifact_create, redact
from runs.agent.asking import ASK_TOOL, ASKED
from runs.agent.budget import budget_enforce
from runs.agent.context import clip
from runs.agent.loops import STOP_AFTER, loop_nudge, loop_observe
from runs.agent.profiles import ModelProfile
from runs.agent.sandbox import CommandCancelled, LocalSandbox, WorkspaceTooLarge
from runs.agent.tools import TOOL_SCHEMAS, Toolbox, ToolDenied, ToolPolicy, tool_call_problem
from runs.agent.turns import profile_for
from runs.agent.workspace import workspace_diff
from runs.models import Patch, Run, ToolCall
from runs.protocol import Outcome, RunCancelled, StepContext, StepFailed
from runs.providers.base import ModelReply
from runs.steps.acting import act_turn
from runs.steps.asking import ask_record, input_wait
from runs.steps.common import S, _restore, test_command_of

TURNS_PER_STEP = 6
# Tools after which the working copy may differ from the checkpointed diff.
MUTATING_TOOLS = frozenset(
    {
        "write_file",
        "replace_text",
        "run_command",
        "insert",
        "undo_edit",
        "run_tests",
        "str_replace_editor",
        "bash",
        "execute_bash",
    }
)


def _short(arguments: dict[str, Any]) -> dict[str, Any]:
    """Tool arguments fit for an event: long strings cut, secrets redacted."""
    return {
        k: redact(v[:200] + "…" if len(v) > 200 else v) if isinstance(v, str) else v
        for k, v in arguments.items()
    }


def _toolbox(ctx: StepContext, sandbox: LocalSandbox) -> Toolbox:
    repository = ctx.repository
    return Toolbox(
        sandbox,
        ToolPolicy(
            forbidden_paths=list(repository.forbidden_paths),
            allowed_commands=list(repository.allowed_commands),
            command_timeout=settings.COMMAND_TIMEOUT_SECONDS,
        ),
        should_stop=ctx.should_stop,
        test_command=test_command_of(ctx),
        # Earlier versions for undo_edit live in the checkpoint, with the diff they undo.
        history=ctx.checkpoint.setdefault("edit_history", {}),
        focus=ctx.task.instruction,
    )


def _tool_call_run(
    ctx: StepContext, toolbox: Toolbox, *, turn_no: int, call_id: str, request: Any
) -> tuple[str, bool]:
    """Carry out one tool call the model asked for; returns its output and ``finished``.

    The call's row and its requested/started (or denied) events commit before it runs,
    so a long command is visible while it runs; its end commits after. A call that a
    crashed attempt already reported is executed again to rebuild the working copy,
    without reporting it twice.
    """
    ctx.check_cancelled()
    keys = {"run": ctx.run, "step_no": ctx.step_no, "turn_no": turn_no, "call_id": call_id}
    existing = ToolCall.objects.filter(**keys).first()
    base = {
        "tool_call_id": call_id,
        "tool": request.name,
        "turn_no": turn_no,
        "step_no": ctx.step_no,
    }
    problem = tool_call_problem(request.name, request.arguments, request.error, TOOL_SCHEMAS)
    if problem:
        return _tool_call_reject(ctx, keys, base, request, problem, existing)
    try:
        toolbox.check(request.name, request.arguments)
        denial = ""
    except ToolDenied as exc:
        denial = str(exc)
    if existing is None:
        _tool_call_open(ctx, keys, base, request, denial)
    if denial:
        return f"denied by policy: {denial}", False
    started = time.monotonic()
    try:
        result = toolbox.execute(request.name, request.arguments)
    except CommandCancelled as exc:
        # The command's process group is already gone; say so before the run ends.
        _tool_call_stopped(ctx, keys, base, error="stopped: run cancelled", started=started)
        raise RunCancelled() from exc
    except WorkspaceTooLarge as exc:
        # The command was killed; a working copy over its limit is not checkpointed.
        _tool_call_stopped(ctx, keys, base, error=str(exc), started=started)
        raise StepFailed("workspace_too_large", str(exc)) from exc
    duration_ms = int((time.monotonic() - started) * 1000)
    report = existing is None or existing.status == ToolCall.Status.STARTED
    with ctx.fenced():
        ToolCall.objects.filter(**keys).update(
            status=result.status,
            result={"output": redact(result.output[:4000]), **result.data},
            error="" if result.status == "completed" else redact(result.output[:1000]),
            duration_ms=duration_ms,
            finished_at=timezone.now(),
        )
        if report:
            ctx.emit(
                f"agent.tool.call.{result.status}",
                {
                    **base,
                    "duration_ms": duration_ms,
                    **result.data,
                    "error": "" if result.status == "completed" else redact(result.output[-300:]),
                },
            )
    return result.output, result.finished


def _tool_call_open(
    ctx: StepContext, keys: dict[str, Any], base: dict[str, Any], request: Any, denial: str
) -> None:
    """The call's row and its requested event, with started or (policy) denied, in one
    fenced commit before the call runs."""
    with ctx.fenced():
        ToolCall.objects.create(
            **keys,
            tool=request.name[:64],
            arguments=request.arguments,
            status=ToolCall.Status.DENIED if denial else ToolCall.Status.STARTED,
            error=denial,
            finished_at=timezone.now() if denial else None,
        )
        ctx.emit("agent.tool.call.requested", {**base, "arguments": _short(request.arguments)})
        if denial:
            ctx.emit("agent.tool.call.denied", {**base, "reason": denial})
            ctx.emit(
                "agent.policy.denied",
                {**base, "reason": denial, "arguments": _short(request.arguments)},
            )
        else:
            ctx.emit("agent.tool.call.started", base)


def _tool_call_stopped(
    ctx: StepContext, keys: dict[str, Any], base: dict[str, Any], *, error: str, started: float
) -> None:
    """A call whose command was stopped: failed, with why, in one fenced commit."""
    with ctx.fenced():
        ToolCall.objects.filter(**keys).update(
            status=ToolCall.Status.FAILED,
            error=error,
            duration_ms=int((time.monotonic() - started) * 1000),
            finished_at=timezone.now(),
        )
        ctx.emit("agent.tool.call.failed", {**base, "error": error})


def _tool_call_reject(
    ctx: StepContext,
    keys: dict[str, Any],
    base: dict[str, Any],
    request: Any,
    problem: str,
    existing: ToolCall | None,
) -> tuple[str, bool]:
    """A call the model got wrong: recorded, never run, answered with what to fix.

    It counts against the model_errors budget (through its turn), not tool_retries.
    """
    if existing is None:
        arguments = request.arguments if not request.error else {"_raw": request.raw_arguments}
        with ctx.fenced():
            ToolCall.objects.create(
                **keys,
                tool=(request.name or "?")[:64],
                arguments=arguments,
                status=ToolCall.Status.REJECTED,
                error=redact(problem)[:2000],
                finished_at=timezone.now(),
            )
    return f"error: {problem}", False


def _call_ids(turn_no: int, requests: list[Any]) -> list[str]:
    """A unique id per call of a turn, even when a server repeats or omits ids."""
    ids: list[str] = []
    for position, request in enumerate(requests):
        call_id = (request.id or f"call-{turn_no}-{position}")[:180]
        if call_id in ids:
            call_id = f"{call_id}#{position}"
        ids.append(call_id)
    return ids


def _problem_note(reply: ModelReply, problem: str, profile: ModelProfile) -> str:
    """What the model is told after a reply it got wrong (besides per-call errors)."""
    names = ", ".join(t["function"]["name"] for t in TOOL_SCHEMAS)
    if problem == "length":
        return (
            f"Your reply was cut off at the output limit ({profile.max_output_tokens} "
            "tokens), so any tool call in it is incomplete and was not run. Take a smaller "
            "step: one tool call at a time, and edit a few lines rather than rewriting a "
            "whole file."
        )
    if problem == "text_only":
        return (
            "Your reply had no tool call. Act only through tool calls "
            f"(tools: {names}); when the change is complete and tested, call finish."
        )
    return ""


def _assistant_message(reply: ModelReply, call_ids: list[str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": reply.content,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": (
                        c.raw_arguments if c.error else json.dumps(c.arguments, sort_keys=True)
                    ),
                },
            }
            for call_id, c in zip(call_ids, reply.tool_calls, strict=True)
        ],
    }


# Budgets whose end submits what the working copy holds rather than throwing it away.
AUTOSUBMIT_BUDGETS = frozenset({"budget_model_turns", "budget_cost", "budget_wall_clock"})


def step_running(ctx: StepContext) -> Outcome:
    """Model turns with tools until the model finishes or the step's turn share is used.

    After each turn the conversation and the working copy's diff are checkpointed, so a
    re-executed step resumes at the next turn; the turn in flight is replayed from its
    stored answer and its tools run again on the restored working copy. A reply the
    model got wrong is answered with what to fix and the run goes on, until the
    model_errors budget is spent. When turns, cost or wall clock run out, or a loop
    that makes no progress is stopped, a working copy with changes is submitted to
    verification like a finished attempt (marked with who submitted it).
    """
    sandbox = _restore(ctx)
    try:
        return _turns_run(ctx, sandbox)
    except StepFailed as exc:
        if exc.reason not in AUTOSUBMIT_BUDGETS:
            raise
        outcome = _autosubmit(ctx, sandbox, by="budget", reason=exc.reason)
        if outcome is None:
            raise
        return outcome


def _turns_run(ctx: StepContext, sandbox: LocalSandbox) -> Outcome:
    toolbox = _toolbox(ctx, sandbox)
    profile = profile_for(ctx)
    progress = ctx.checkpoint.get("progress") or {}
    resuming = progress.get("step_no") == ctx.step_no
    first_turn = int(progress.get("turn_no", 0)) + 1 if resuming else 1
    finished = bool(progress.get("finished")) if resuming else False
    messages: list[dict[str, Any]] = list(ctx.checkpoint.get("messages", []))
    act_turns = int(ctx.checkpoint.get("act_turns", 0))
    if ctx.checkpoint.get("input_pending"):
        # The asking turn was checkpointed before this step's commit was lost.
        return input_wait(ctx)
    for turn_no in range(first_turn, TURNS_PER_STEP + 1):
        if finished:
            break
        reply, messages = act_turn(
            ctx, turn_no=turn_no, messages=messages, profile=profile, turn_index=act_turns
        )
        act_turns += 1
        finished, loop = _turn_tools(ctx, toolbox, turn_no, reply, messages, profile)
        if any(c.name in MUTATING_TOOLS for c in reply.tool_calls):
            ctx.checkpoint["diff"] = workspace_diff(sandbox, ctx.run.base_commit).text
        ctx.checkpoint.update(
            messages=messages,
            act_turns=act_turns,
            progress={"step_no": ctx.step_no, "turn_no": turn_no, "finished": finished},
        )
        with ctx.fenced():
            Run.objects.filter(pk=ctx.run.pk).update(checkpoint=ctx.checkpoint)
        if ctx.checkpoint.get("input_pending"):
            return input_wait(ctx)
        if loop == "stop":
            outcome = _autosubmit(ctx, sandbox, by="loop", reason="agent_loop")
            if outcome is None:
                raise StepFailed(
                    "agent_loop",
                    f"the model repeated the same calls {STOP_AFTER} turns in a row "
                    "with nothing new to submit",
                )
            return outcome
        budget_enforce(ctx, "tool_retries")
    if not finished:
        return Outcome()  # stay in running; the next step continues the conversation
    ctx.checkpoint.pop("submitted_by", None)
    return _patch_record(ctx, sandbox)


def _turn_tools(
    ctx: StepContext,
    toolbox: Toolbox,
    turn_no: int,
    reply: ModelReply,
    messages: list[dict[str, Any]],
    profile: ModelProfile,
) -> tuple[bool, str]:
    """The turn's calls carried out and answered in ``messages`` (changed in place);
    returns whether the model finished and what the loop check says."""
    call_ids = _call_ids(turn_no, reply.tool_calls)
    messages.append(_assistant_message(reply, call_ids))
    cut_off = reply.finish_reason == "length"
    finished = False
    observed: list[tuple[str, dict[str, Any], str]] = []
    for call_id, request in zip(call_ids, reply.tool_calls, strict=True):
        keys = {"run": ctx.run, "step_no": ctx.step_no, "turn_no": turn_no, "call_id": call_id}
        if cut_off:
            output, done = _tool_call_reject(
                ctx,
                keys,
                {},
                request,
                "the reply was cut off at the output limit; this call was not run",
                ToolCall.objects.filter(**keys).first(),
            )
        else:
            output, done = _tool_call_run(
                ctx, toolbox, turn_no=turn_no, call_id=call_id, request=request
            )
        if request.name == ASK_TOOL and output == ASKED and not cut_off:
            ask_record(ctx, turn_no=turn_no, call_id=call_id, arguments=request.arguments)
        if done and request.name == "finish":
            ctx.checkpoint["summary"] = str(request.arguments.get("summary") or "")[:2000]
        observed.append((request.name, request.arguments, output))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": clip(output)})
        finished = finished or done
    note = _problem_note(
        reply, "length" if cut_off else "" if reply.tool_calls else "text_only", profile
    )
    if note:
        messages.append({"role": "user", "content": note})
    if finished:
        return True, ""
    return False, _loop_check(ctx, turn_no, observed, messages)


def _loop_check(
    ctx: StepContext,
    turn_no: int,
    observed: list[tuple[str, dict[str, Any], str]],
    messages: list[dict[str, Any]],
) -> str:
    """Nudge a model that repeats itself, or say the loop must stop (see runs.agent.loops).

    The state belongs to the attempt: feedback from verification or the judge starts a
    fresh count.
    """
    attempt_no = int(ctx.checkpoint.get("attempt_no", 1))
    state = ctx.checkpoint.get("loop") or {}
    if state.get("attempt_no") != attempt_no:
        state = {"attempt_no": attempt_no}
    verdict = loop_observe(state, observed)
    ctx.checkpoint["loop"] = state
    if verdict.action:
        ctx.emit(
            "agent.loop.detected",
            {
                "turn_no": turn_no,
                "step_no": ctx.step_no,
                "action": verdict.action,
                "stale_turns": verdict.stale_turns,
                "calls": [c[:200] for c in verdict.repeated],
            },
        )
    if verdict.action == "nudge":
        messages.append({"role": "user", "content": loop_nudge(verdict)})
    return verdict.action


def _autosubmit(ctx: StepContext, sandbox: LocalSandbox, *, by: str, reason: str) -> Outcome | None:
    """The working copy's changes submitted as if the model had finished, or None.

    None when there is nothing to submit, or when exactly this diff was already
    submitted in the run (it failed verification or review once: sending it again
    would only go round in a circle).
    """
    diff = workspace_diff(sandbox, ctx.run.base_commit)
    if not diff.text.strip():
        return None
    attempt_no = int(ctx.checkpoint.get("attempt_no", 1))
    # This attempt's own patch may exist: a step that crashed after recording it runs
    # again, and _patch_record returns the same row.
    earlier = Patch.objects.filter(run=ctx.run, diff_sha256=diff.sha256)
    if earlier.exclude(attempt_no=attempt_no).exists():
        return None
    ctx.checkpoint["submitted_by"] = by
    ctx.checkpoint.pop("summary", None)  # an earlier attempt's; this one has none
    ctx.emit(
        "agent.run.autosubmitted",
        {"submitted_by": by, "reason": reason, "sha256": diff.sha256, "files": diff.files},
    )
    return _patch_record(ctx, sandbox, submitted_by=by)


def _patch_record(ctx: StepContext, sandbox: LocalSandbox, *, submitted_by: str = "") -> Outcome:
    """The attempt's diff as a Patch (once, even if this step runs again)."""
    diff = workspace_diff(sandbox, ctx.run.base_commit)
    ctx.checkpoint["diff"] = diff.text
    if not diff.text.strip():
        raise StepFailed("empty_patch", "the agent finished without changing anything")
    attempt_no = int(ctx.checkpoint.get("attempt_no", 1))
    patch = Patch.objects.filter(run=ctx.run, attempt_no=attempt_no).first()
    if patch is None:
        with ctx.fenced():
            artifact = artifact_create(
                run=ctx.run,
                kind="diff",
                name=f"patch {attempt_no}",
                content=diff.text,
                content_type="text/x-diff",
            )
            patch = Patch.objects.create(
                run=ctx.run,
                attempt_no=attempt_no,
                diff_sha256=diff.sha256,
                diff_artifact=artifact,
                files_changed=diff.files,
                lines_added=diff.added,
                lines_removed=diff.removed,
                submitted_by=submitted_by,
            )
            ctx.emit(
                "agent.patch.created",
                {
                    "patch_id": patch.id,
                    "attempt_no": attempt_no,
                    "sha256": patch.diff_sha256,
                    "files": patch.files_changed,
                    "lines_added": patch.lines_added,
                    "lines_removed": patch.lines_removed,
                    "artifact_id": str(artifact.id),
                    "submitted_by": patch.submitted_by or "model",
                },
            )
    ctx.checkpoint["patch_id"] = patch.id
    return Outcome(to=S.VERIFYING)
