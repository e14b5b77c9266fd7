"""One handler per run state. A handler does the state's work and returns an Outcome;
the engine commits it. Handlers are safe to re-execute after a crash: rows they create
carry natural keys, and the working copy is rebuilt from the last checkpoint."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.agent.artifacts import artifact_create, redact
from runs.agent.budget import Spent, budget_enforce, budget_exhausted, budget_used
from runs.agent.judge import (
    DEFAULT_MAX_DIFF_LINES,
    Verdict,
    judge_model_parse,
    judge_rules,
    verdict_combine,
)
from runs.agent.sandbox import CommandCancelled, LocalSandbox, SandboxError
from runs.agent.tools import TOOL_SCHEMAS, Toolbox, ToolDenied, ToolPolicy
from runs.agent.turns import turn_obtain
from runs.agent.verify import verification_classify, verification_summary
from runs.agent.workspace import (
    workspace_clone,
    workspace_diff,
    workspace_ensure,
    workspace_restore,
)
from runs.engine import (
    Handler,
    Outcome,
    RunCancelled,
    StepContext,
    StepFailed,
    TransientStepError,
)
from runs.gitproviders import git_provider_for
from runs.gitproviders.base import GitProviderError, branch_commit
from runs.models import (
    Approval,
    JudgeAttempt,
    Patch,
    PullRequest,
    Run,
    ToolCall,
    VerificationAttempt,
)

S = Run.Status
TURNS_PER_STEP = 6
# Tools after which the working copy may differ from the checkpointed diff.
MUTATING_TOOLS = frozenset({"write_file", "replace_text", "run_command"})
CONTEXT_CHAR_BUDGET = 24_000

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a git repository. Use the tools to "
    "read code, make the smallest change that does what is asked, run the tests, and call "
    "finish when the change is complete."
)


def _sandbox(ctx: StepContext) -> Any:
    try:
        return workspace_ensure(run=ctx.run, diff=ctx.checkpoint.get("diff"))
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc


# --- queued / preparing / context_loading / planning ----------------------------------


def step_queued(ctx: StepContext) -> Outcome:
    ctx.emit("agent.run.started", {"run_no": ctx.run.run_no, "attempt": ctx.lease.attempt})
    return Outcome(to=S.PREPARING)


def step_preparing(ctx: StepContext) -> Outcome:
    """Clone the repository; follow-ups start from the task's PR branch."""
    repository = ctx.repository
    pr = PullRequest.objects.filter(task=ctx.task).first()
    ref = ctx.task.target_branch or repository.default_branch
    branch = pr.branch if pr else f"agent/{ctx.task.id.hex[:12]}"
    start_ref = f"origin/{branch}" if pr else f"origin/{ref}"
    ctx.check_cancelled()
    try:
        sandbox, sha = workspace_clone(run=ctx.run, ref=start_ref)
    except SandboxError as exc:
        raise StepFailed("clone_failed", str(exc)) from exc
    ctx.checkpoint.update({"diff": "", "attempt_no": 1, "act_turns": 0, "messages": []})
    ctx.emit(
        "agent.sandbox.created",
        {"base_commit": sha, "ref": start_ref, "sandbox": sandbox.path.name},
    )
    return Outcome(to=S.CONTEXT_LOADING, fields={"base_commit": sha, "branch": branch})


def repository_map(ctx: StepContext) -> str:
    """Files with their sizes and the first lines of each, within a character budget."""
    sandbox = _sandbox(ctx)
    root = sandbox.path
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts
    )
    lines = [f"{len(files)} files"]
    for path in files:
        relative = path.relative_to(root)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            lines.append(f"- {relative} (binary)")
            continue
        head = " | ".join(s.strip() for s in text.splitlines()[:3] if s.strip())[:120]
        lines.append(f"- {relative} ({len(text.splitlines())} lines) {head}")
        if sum(len(line) for line in lines) > CONTEXT_CHAR_BUDGET:
            lines.append("- ... (truncated to the context budget)")
            break
    return "\n".join(lines)


def step_context_loading(ctx: StepContext) -> Outcome:
    repo_map = repository_map(ctx)
    context = artifact_create(run=ctx.run, kind="context", name="repository map", content=repo_map)
    user = f"Task: {ctx.task.instruction}\n\nRepository map:\n{repo_map}"
    if ctx.run.feedback:
        user += f"\n\nFeedback to address on the existing pull request:\n{ctx.run.feedback}"
    ctx.checkpoint["messages"] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]
    ctx.emit("agent.context.loaded", {"artifact_id": str(context.id), "chars": len(repo_map)})
    return Outcome(to=S.PLANNING)


def step_planning(ctx: StepContext) -> Outcome:
    messages = list(ctx.checkpoint["messages"])
    ask = [*messages, {"role": "user", "content": "Write a short plan before acting."}]
    reply = turn_obtain(ctx, turn_no=0, purpose="plan", messages=ask, tools=[], turn_index=0)
    plan = artifact_create(run=ctx.run, kind="plan", name="plan", content=reply.content)
    messages.append({"role": "assistant", "content": f"Plan:\n{reply.content}"})
    ctx.checkpoint["messages"] = messages
    ctx.emit("agent.plan.created", {"artifact_id": str(plan.id), "summary": reply.content[:300]})
    return Outcome(to=S.RUNNING)


# --- running ---------------------------------------------------------------------------


def _restore(ctx: StepContext) -> LocalSandbox:
    """The working copy exactly as the checkpoint describes it (see workspace_restore)."""
    try:
        return workspace_restore(run=ctx.run, diff=ctx.checkpoint.get("diff"))
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc


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
    try:
        toolbox.check(request.name, request.arguments)
        denial = ""
    except ToolDenied as exc:
        denial = str(exc)
    if existing is None:
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
    if denial:
        return f"denied by policy: {denial}", False
    started = time.monotonic()
    try:
        result = toolbox.execute(request.name, request.arguments)
    except CommandCancelled as exc:
        # The command's process group is already gone; say so before the run ends.
        with ctx.fenced():
            ToolCall.objects.filter(**keys).update(
                status=ToolCall.Status.FAILED,
                error="stopped: run cancelled",
                duration_ms=int((time.monotonic() - started) * 1000),
                finished_at=timezone.now(),
            )
            ctx.emit("agent.tool.call.failed", {**base, "error": "stopped: run cancelled"})
        raise RunCancelled() from exc
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


def _call_ids(turn_no: int, requests: list[Any]) -> list[str]:
    """A unique id per call of a turn, even when a server repeats or omits ids."""
    ids: list[str] = []
    for position, request in enumerate(requests):
        call_id = (request.id or f"call-{turn_no}-{position}")[:180]
        if call_id in ids:
            call_id = f"{call_id}#{position}"
        ids.append(call_id)
    return ids


def step_running(ctx: StepContext) -> Outcome:
    """Model turns with tools until the model finishes or the step's turn share is used.

    After each turn the conversation and the working copy's diff are checkpointed, so a
    re-executed step resumes at the next turn; the turn in flight is replayed from its
    stored answer and its tools run again on the restored working copy.
    """
    sandbox = _restore(ctx)
    toolbox = _toolbox(ctx, sandbox)
    progress = ctx.checkpoint.get("progress") or {}
    resuming = progress.get("step_no") == ctx.step_no
    first_turn = int(progress.get("turn_no", 0)) + 1 if resuming else 1
    finished = bool(progress.get("finished")) if resuming else False
    messages: list[dict[str, Any]] = list(ctx.checkpoint.get("messages", []))
    act_turns = int(ctx.checkpoint.get("act_turns", 0))
    for turn_no in range(first_turn, TURNS_PER_STEP + 1):
        if finished:
            break
        reply = turn_obtain(
            ctx,
            turn_no=turn_no,
            purpose="act",
            messages=messages,
            tools=TOOL_SCHEMAS,
            turn_index=act_turns,
        )
        act_turns += 1
        call_ids = _call_ids(turn_no, reply.tool_calls)
        messages.append(
            {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for call_id, c in zip(call_ids, reply.tool_calls, strict=True)
                ],
            }
        )
        if not reply.tool_calls:
            messages.append({"role": "user", "content": "Use a tool, or call finish."})
        for call_id, request in zip(call_ids, reply.tool_calls, strict=True):
            output, done = _tool_call_run(
                ctx, toolbox, turn_no=turn_no, call_id=call_id, request=request
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output[:8000]})
            finished = finished or done
        if any(c.name in MUTATING_TOOLS for c in reply.tool_calls):
            ctx.checkpoint["diff"] = workspace_diff(sandbox, ctx.run.base_commit).text
        ctx.checkpoint.update(
            messages=messages,
            act_turns=act_turns,
            progress={"step_no": ctx.step_no, "turn_no": turn_no, "finished": finished},
        )
        with ctx.fenced():
            Run.objects.filter(pk=ctx.run.pk).update(checkpoint=ctx.checkpoint)
        budget_enforce(ctx, "tool_retries")
    if not finished:
        return Outcome()  # stay in running; the next step continues the conversation
    return _patch_record(ctx, sandbox)


def _patch_record(ctx: StepContext, sandbox: LocalSandbox) -> Outcome:
    """The finished attempt's diff as a Patch (once, even if this step runs again)."""
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
                },
            )
    ctx.checkpoint["patch_id"] = patch.id
    return Outcome(to=S.VERIFYING)


# --- verifying / judging ------------------------------------------------------------------


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


def step_verifying(ctx: StepContext) -> Outcome:
    """Run the repository's test command on exactly the patch; categorise the outcome."""
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    command = ctx.repository.test_command
    existing = VerificationAttempt.objects.filter(
        run=ctx.run, patch=patch, verifier="test_command"
    ).first()
    data = {"patch_id": patch.id, "command": command, "attempt_no": patch.attempt_no}
    if existing is None:
        sandbox = _restore(ctx)
        ctx.check_cancelled()
        with ctx.fenced():
            ctx.emit("agent.verification.started", data)
        try:
            result = sandbox.run(
                command, timeout=settings.COMMAND_TIMEOUT_SECONDS, should_stop=ctx.should_stop
            )
        except CommandCancelled as exc:
            raise RunCancelled() from exc
        outcome = verification_classify(result)
        summary = verification_summary(result.output)
        log = artifact_create(
            run=ctx.run, kind="log", name=f"verification {patch.attempt_no}", content=result.output
        )
        existing = VerificationAttempt(
            run=ctx.run,
            patch=patch,
            verifier="test_command",
            command=command,
            outcome=outcome,
            exit_code=result.exit_code,
            duration_ms=result.duration_ms,
            summary=redact(summary),
            log_artifact=log,
        )
        ctx.write_on_commit(existing.save)
    result_data = {
        **data,
        "outcome": existing.outcome,
        "exit_code": existing.exit_code,
        "duration_ms": existing.duration_ms,
        "log_artifact_id": str(existing.log_artifact_id),
    }
    if existing.outcome == VerificationAttempt.Outcome.PASSED:
        ctx.emit("agent.verification.passed", result_data)
        return Outcome(to=S.JUDGING)
    kind = "errored" if existing.outcome == VerificationAttempt.Outcome.ERRORED else "failed"
    ctx.emit(f"agent.verification.{kind}", result_data)
    return _retry_with_feedback(
        ctx,
        reason=f"verification_{existing.outcome}",
        feedback=(
            f"The tests failed ({existing.outcome}) after your change. "
            f"Fix it. Summary of `{command}`:\n{existing.summary}"
        ),
    )


JUDGE_PROMPT = (
    "You review a patch made by a coding agent. Answer with JSON only: "
    '{"verdict": "accept" | "revise" | "block", "score": <0..1>, "reasons": "<short>"}. '
    "Block only for harmful or unrelated changes; ask to revise when the change does not "
    "do what was asked."
)


def _model_judge(ctx: StepContext, diff_text: str) -> Verdict | None:
    """The optional model judge: a score and a verdict, checkpointed like any turn."""
    if not (ctx.task.model_options.get("model_judge", settings.AGENT_MODEL_JUDGE)):
        return None
    messages = [
        {"role": "system", "content": JUDGE_PROMPT},
        {"role": "user", "content": f"Task: {ctx.task.instruction}\n\nPatch:\n{diff_text[:40000]}"},
    ]
    reply = turn_obtain(ctx, turn_no=0, purpose="judge", messages=messages, tools=[], turn_index=0)
    return judge_model_parse(reply.content)


def step_judging(ctx: StepContext) -> Outcome:
    """Rule checks on the patch, then the optional model judge; the worst verdict wins."""
    patch = Patch.objects.select_related("diff_artifact").get(pk=ctx.checkpoint["patch_id"])
    # The stored artifact is redacted; the judge must see what would be pushed.
    diff_text = ctx.checkpoint.get("diff") or ""
    if hashlib.sha256(diff_text.encode("utf-8")).hexdigest() != patch.diff_sha256:
        diff_text = patch.diff_artifact.content
    rules = judge_rules(
        diff_text=diff_text,
        files=list(patch.files_changed),
        lines_changed=patch.lines_added + patch.lines_removed,
        forbidden_paths=list(ctx.repository.forbidden_paths),
        scope=ctx.task.model_options.get("scope"),
        max_diff_lines=int(ctx.task.model_options.get("max_diff_lines", DEFAULT_MAX_DIFF_LINES)),
    )
    verdicts = [("rules", rules)]
    if rules.verdict != "block":
        model = _model_judge(ctx, diff_text)
        if model is not None:
            verdicts.append(("model", model))
    for judge, verdict in verdicts:

        def record_attempt(judge: str = judge, verdict: Verdict = verdict) -> None:
            JudgeAttempt.objects.get_or_create(
                run=ctx.run,
                patch=patch,
                judge=judge,
                defaults={
                    "verdict": verdict.verdict,
                    "findings": verdict.findings,
                    "score": verdict.score,
                },
            )

        ctx.write_on_commit(record_attempt)
        ctx.emit(
            "agent.judge.completed",
            {
                "patch_id": patch.id,
                "judge": judge,
                "verdict": verdict.verdict,
                "score": verdict.score,
                "findings": verdict.findings,
            },
        )
    worst = verdict_combine([v for _, v in verdicts])
    if worst.verdict == "block":
        rules_hit = ", ".join(sorted({str(f.get("rule")) for f in worst.findings}))
        raise StepFailed("judge_blocked", f"blocked by: {rules_hit}")
    if worst.verdict == "revise":
        return _retry_with_feedback(
            ctx,
            reason="judge_revise",
            feedback=f"A reviewer asks for changes: {json.dumps(worst.findings)}",
        )
    if ctx.task.execution_mode == "supervised_pr" or ctx.task.risk_level == "high":
        expires = timezone.now() + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)

        def request_approval() -> None:
            Approval.objects.get_or_create(
                run=ctx.run,
                status=Approval.Status.PENDING,
                defaults={"patch": patch, "patch_sha256": patch.diff_sha256, "expires_at": expires},
            )

        ctx.write_on_commit(request_approval)
        ctx.emit(
            "agent.approval.requested",
            {
                "patch_id": patch.id,
                "patch_sha256": patch.diff_sha256,
                "expires_at": expires.isoformat(),
            },
        )
        return Outcome(to=S.AWAITING_APPROVAL, wait=True)
    return Outcome(to=S.CREATING_PR)


def step_awaiting_approval(ctx: StepContext) -> Outcome:
    """Act on the decision recorded by approve/reject/expire; wait while it is pending."""
    approval = Approval.objects.filter(run=ctx.run).order_by("-requested_at").first()
    if approval is None or approval.status == Approval.Status.PENDING:
        return Outcome(noop=True)
    if approval.status == Approval.Status.REJECTED:
        return Outcome(to=S.FAILED, reason="approval_rejected", detail=approval.comment)
    if approval.status == Approval.Status.EXPIRED:
        return Outcome(to=S.FAILED, reason="approval_expired")
    if approval.status == Approval.Status.APPROVED:
        patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
        if patch.diff_sha256 != approval.patch_sha256:
            # The patch changed after it was approved: the approval does not cover it.
            approval.status = Approval.Status.VOID
            approval_pk = approval.pk

            def void_approval() -> None:
                Approval.objects.filter(pk=approval_pk).update(status=Approval.Status.VOID)

            ctx.write_on_commit(void_approval)
            return Outcome(
                to=S.FAILED, reason="approval_void", detail="patch changed after approval"
            )
        return Outcome(to=S.CREATING_PR)
    return Outcome(noop=True)


# --- creating_pr -----------------------------------------------------------------------------


def step_creating_pr(ctx: StepContext) -> Outcome:
    """Commit, push and open (or update) the task's single pull request.

    Each part of the saga repeats safely: the commit is remade from the checkpointed
    patch, the push is forced onto the task's own branch, the provider looks the PR up by
    branch before opening one, and the row is an upsert on (task, provider). A dry run
    stops before anything leaves the sandbox.
    """
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    if ctx.task.execution_mode == "dry_run":
        ctx.emit("agent.pr.skipped", {"reason": "dry_run", "patch_id": patch.id})
        return Outcome(to=S.COMPLETED)
    repository = ctx.repository
    provider = git_provider_for(repository.provider)
    sandbox = _restore(ctx)
    branch = ctx.run.branch
    base_branch = ctx.task.target_branch or repository.default_branch
    title = f"agent: {ctx.task.instruction.splitlines()[0][:80]}"
    body = (
        f"{ctx.task.instruction}\n\n---\nRun {ctx.run.run_no} ({ctx.run.id}), "
        f"attempt {patch.attempt_no}, patch {patch.diff_sha256[:12]}."
    )
    if ctx.run.feedback:
        body += f"\n\nAddresses feedback:\n{ctx.run.feedback[:2000]}"
    ctx.emit(
        "agent.pr.creation.requested",
        {"branch": branch, "base": base_branch, "provider": provider.name},
    )
    ctx.check_cancelled()
    try:
        head_sha = branch_commit(sandbox=sandbox, branch=branch, message=title)
        provider.branch_push(repository=repository, sandbox=sandbox, branch=branch)
        info = provider.pull_request_ensure(
            repository=repository,
            branch=branch,
            base_branch=base_branch,
            title=title,
            body=body,
            head_sha=head_sha,
        )
    except GitProviderError as exc:
        if exc.retryable:
            raise TransientStepError(str(exc)) from exc
        ctx.emit("agent.pr.creation.failed", {"branch": branch, "error": redact(str(exc))[:500]})
        raise StepFailed("pr_creation_failed", str(exc)) from exc
    except SandboxError as exc:
        ctx.emit("agent.pr.creation.failed", {"branch": branch, "error": redact(str(exc))[:500]})
        raise StepFailed("pr_creation_failed", str(exc)) from exc

    existed = PullRequest.objects.filter(task=ctx.task, provider=provider.name).exists()

    def record() -> None:
        PullRequest.objects.update_or_create(
            task=ctx.task,
            provider=provider.name,
            defaults={
                "branch": branch,
                "base_branch": base_branch,
                "number": info.number,
                "url": info.url,
                "head_sha": head_sha,
                "title": title,
                "last_run": ctx.run,
                "state": PullRequest.State.OPEN,
            },
        )

    ctx.write_on_commit(record)
    kind = "updated" if existed or not info.created else "created"
    ctx.emit(
        f"agent.pr.{kind}",
        {
            "number": info.number,
            "url": info.url,
            "branch": branch,
            "head_sha": head_sha,
            "provider": provider.name,
            "reconciled": not existed and not info.created,
        },
    )
    return Outcome(to=S.COMPLETED)


HANDLERS: dict[str, Handler] = {
    S.QUEUED: step_queued,
    S.PREPARING: step_preparing,
    S.CONTEXT_LOADING: step_context_loading,
    S.PLANNING: step_planning,
    S.RUNNING: step_running,
    S.VERIFYING: step_verifying,
    S.JUDGING: step_judging,
    S.AWAITING_APPROVAL: step_awaiting_approval,
    S.CREATING_PR: step_creating_pr,
}
