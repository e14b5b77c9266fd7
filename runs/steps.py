"""One handler per run state. A handler does the state's work and returns an Outcome;
the engine commits it. Handlers are safe to re-execute after a crash: rows they create
carry natural keys, and the working copy is rebuilt from the last checkpoint."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.agent.artifacts import artifact_create
from runs.agent.judge import judge_rules
from runs.agent.sandbox import CommandCancelled, SandboxError
from runs.agent.tools import TOOL_SCHEMAS, ToolDenied, Toolbox, ToolPolicy
from runs.agent.turns import turn_obtain
from runs.agent.verify import verification_classify, verification_summary
from runs.agent.workspace import workspace_clone, workspace_diff, workspace_ensure
from runs.engine import Handler, Outcome, RunCancelled, StepContext, StepFailed
from runs.gitproviders import git_provider_for
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
    ctx.emit("agent.sandbox.created", {"base_commit": sha, "ref": start_ref,
                                       "sandbox": sandbox.path.name})
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
    ask = messages + [{"role": "user", "content": "Write a short plan before acting."}]
    reply = turn_obtain(ctx, turn_no=0, purpose="plan", messages=ask, tools=[], turn_index=0)
    plan = artifact_create(run=ctx.run, kind="plan", name="plan", content=reply.content)
    messages.append({"role": "assistant", "content": f"Plan:\n{reply.content}"})
    ctx.checkpoint["messages"] = messages
    ctx.emit("agent.plan.created", {"artifact_id": str(plan.id), "summary": reply.content[:300]})
    return Outcome(to=S.RUNNING)


# --- running ---------------------------------------------------------------------------


def _tool_events(ctx: StepContext, call: ToolCall) -> None:
    base = {"tool_call_id": call.call_id, "tool": call.tool, "turn_no": call.turn_no}
    ctx.emit("agent.tool.call.requested", {**base, "arguments": _short(call.arguments)})
    if call.status == ToolCall.Status.DENIED:
        ctx.emit("agent.tool.call.denied", {**base, "reason": call.error})
        ctx.emit("agent.policy.denied", {**base, "reason": call.error})
        return
    ctx.emit("agent.tool.call.started", base)
    ctx.emit(f"agent.tool.call.{call.status}", {**base, "duration_ms": call.duration_ms,
                                               "error": call.error[:300]})


def _short(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:200] + "…" if isinstance(v, str) and len(v) > 200 else v)
            for k, v in arguments.items()}


def step_running(ctx: StepContext) -> Outcome:
    """Model turns with tools until the model finishes or the step's turn share is used."""
    sandbox = _sandbox(ctx)
    repository = ctx.repository
    toolbox = Toolbox(
        sandbox,
        ToolPolicy(
            forbidden_paths=list(repository.forbidden_paths),
            allowed_commands=list(repository.allowed_commands),
            command_timeout=settings.COMMAND_TIMEOUT_SECONDS,
        ),
        should_stop=ctx.should_stop,
    )
    messages: list[dict[str, Any]] = list(ctx.checkpoint.get("messages", []))
    act_turns = int(ctx.checkpoint.get("act_turns", 0))
    tool_failures = int(ctx.checkpoint.get("tool_failures", 0))
    finished = False
    for turn_no in range(1, TURNS_PER_STEP + 1):
        reply = turn_obtain(
            ctx, turn_no=turn_no, purpose="act", messages=messages, tools=TOOL_SCHEMAS,
            turn_index=act_turns,
        )
        act_turns += 1
        messages.append({
            "role": "assistant",
            "content": reply.content,
            "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in reply.tool_calls
            ],
        })
        if not reply.tool_calls:
            messages.append({"role": "user", "content": "Use a tool, or call finish."})
            continue
        for request in reply.tool_calls:
            ctx.check_cancelled()
            call = ToolCall(run=ctx.run, step_no=ctx.step_no, turn_no=turn_no,
                            call_id=request.id, tool=request.name, arguments=request.arguments)
            started = timezone.now()
            try:
                toolbox.check(request.name, request.arguments)
            except ToolDenied as exc:
                call.status, call.error = ToolCall.Status.DENIED, str(exc)
                output = f"denied: {exc}"
            else:
                try:
                    result = toolbox.execute(request.name, request.arguments)
                except CommandCancelled as exc:
                    raise RunCancelled() from exc
                call.status = result.status
                call.result = {"output": result.output[:4000], **result.data}
                output = result.output
                if result.status != "completed":
                    call.error = result.output[:1000]
                    tool_failures += 1
                finished = finished or result.finished
            call.finished_at = timezone.now()
            call.duration_ms = int((call.finished_at - started).total_seconds() * 1000)
            _tool_events(ctx, call)
            ctx.write_on_commit(lambda call=call: ToolCall.objects.update_or_create(
                run=call.run, step_no=call.step_no, turn_no=call.turn_no, call_id=call.call_id,
                defaults={"tool": call.tool, "arguments": call.arguments, "status": call.status,
                          "result": call.result, "error": call.error,
                          "duration_ms": call.duration_ms, "finished_at": call.finished_at},
            ))
            messages.append({"role": "tool", "tool_call_id": request.id, "content": output[:8000]})
        if tool_failures > ctx.task.budget_limit("tool_retries"):
            raise StepFailed("budget_tool_retries", f"{tool_failures} failed tool calls")
        if finished:
            break
    ctx.checkpoint.update(messages=messages, act_turns=act_turns, tool_failures=tool_failures)
    diff = workspace_diff(sandbox, ctx.run.base_commit)
    ctx.checkpoint["diff"] = diff.text
    if not finished:
        return Outcome()  # stay in running; the next step continues the conversation
    if not diff.text.strip():
        raise StepFailed("empty_patch", "the agent finished without changing anything")
    attempt_no = int(ctx.checkpoint.get("attempt_no", 1))
    diff_artifact = artifact_create(run=ctx.run, kind="diff", name=f"patch {attempt_no}",
                                    content=diff.text, content_type="text/x-diff",
                                    redacted=False)
    patch, _ = Patch.objects.get_or_create(
        run=ctx.run, attempt_no=attempt_no,
        defaults={"diff_sha256": diff.sha256, "diff_artifact": diff_artifact,
                  "files_changed": diff.files, "lines_added": diff.added,
                  "lines_removed": diff.removed},
    )
    ctx.checkpoint["patch_id"] = patch.id
    ctx.emit("agent.patch.created", {
        "patch_id": patch.id, "attempt_no": attempt_no, "sha256": patch.diff_sha256,
        "files": patch.files_changed, "lines_added": patch.lines_added,
        "lines_removed": patch.lines_removed, "artifact_id": str(patch.diff_artifact_id),
    })
    return Outcome(to=S.VERIFYING)


# --- verifying / judging ------------------------------------------------------------------


def _retry_with_feedback(ctx: StepContext, *, reason: str, feedback: str) -> Outcome:
    attempt_no = int(ctx.checkpoint.get("attempt_no", 1))
    if attempt_no >= ctx.task.budget_limit("agent_attempts"):
        raise StepFailed(reason, f"attempt budget spent after {attempt_no} attempts")
    ctx.checkpoint["attempt_no"] = attempt_no + 1
    messages = list(ctx.checkpoint.get("messages", []))
    messages.append({"role": "user", "content": feedback})
    ctx.checkpoint["messages"] = messages
    return Outcome(to=S.RUNNING, reason=reason)


def step_verifying(ctx: StepContext) -> Outcome:
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    command = ctx.repository.test_command
    existing = VerificationAttempt.objects.filter(run=ctx.run, patch=patch,
                                                  verifier="test_command").first()
    if existing is None:
        sandbox = _sandbox(ctx)
        ctx.check_cancelled()
        try:
            result = sandbox.run(command, timeout=settings.COMMAND_TIMEOUT_SECONDS,
                                 should_stop=ctx.should_stop)
        except CommandCancelled as exc:
            raise RunCancelled() from exc
        outcome = verification_classify(result)
        summary = verification_summary(result.output)
        log = artifact_create(run=ctx.run, kind="log", name=f"verification {patch.attempt_no}",
                              content=result.output)
        existing = VerificationAttempt(
            run=ctx.run, patch=patch, verifier="test_command", command=command,
            outcome=outcome, exit_code=result.exit_code, duration_ms=result.duration_ms,
            summary=summary, log_artifact=log,
        )
        ctx.write_on_commit(existing.save)
    data = {"patch_id": patch.id, "command": command, "attempt_no": patch.attempt_no}
    ctx.emit("agent.verification.started", data)
    result_data = {**data, "outcome": existing.outcome, "exit_code": existing.exit_code,
                   "duration_ms": existing.duration_ms,
                   "log_artifact_id": str(existing.log_artifact_id)}
    if existing.outcome == VerificationAttempt.Outcome.PASSED:
        ctx.emit("agent.verification.passed", result_data)
        return Outcome(to=S.JUDGING)
    kind = "errored" if existing.outcome == VerificationAttempt.Outcome.ERRORED else "failed"
    ctx.emit(f"agent.verification.{kind}", result_data)
    return _retry_with_feedback(
        ctx, reason=f"verification_{existing.outcome}",
        feedback=(f"The tests failed ({existing.outcome}) after your change. "
                  f"Fix it. Summary of `{command}`:\n{existing.summary}"),
    )


def step_judging(ctx: StepContext) -> Outcome:
    patch = Patch.objects.select_related("diff_artifact").get(pk=ctx.checkpoint["patch_id"])
    verdict = judge_rules(
        diff_text=patch.diff_artifact.content, files=list(patch.files_changed),
        lines_changed=patch.lines_added + patch.lines_removed,
        forbidden_paths=list(ctx.repository.forbidden_paths),
        scope=ctx.task.model_options.get("scope"),
        max_diff_lines=int(ctx.task.model_options.get("max_diff_lines", 2000)),
    )
    ctx.write_on_commit(lambda: JudgeAttempt.objects.get_or_create(
        run=ctx.run, patch=patch, judge="rules",
        defaults={"verdict": verdict.verdict, "findings": verdict.findings},
    ))
    ctx.emit("agent.judge.completed", {"patch_id": patch.id, "judge": "rules",
                                       "verdict": verdict.verdict, "findings": verdict.findings})
    if verdict.verdict == "block":
        rules = ", ".join(sorted({f["rule"] for f in verdict.findings}))
        raise StepFailed("judge_blocked", f"blocked by rules: {rules}")
    if verdict.verdict == "revise":
        return _retry_with_feedback(
            ctx, reason="judge_revise",
            feedback=f"A reviewer asks for changes: {json.dumps(verdict.findings)}",
        )
    if ctx.task.execution_mode == "supervised_pr" or ctx.task.risk_level == "high":
        expires = timezone.now() + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)

        def request_approval() -> None:
            Approval.objects.get_or_create(
                run=ctx.run, status=Approval.Status.PENDING,
                defaults={"patch": patch, "patch_sha256": patch.diff_sha256,
                          "expires_at": expires},
            )

        ctx.write_on_commit(request_approval)
        ctx.emit("agent.approval.requested", {"patch_id": patch.id,
                                              "patch_sha256": patch.diff_sha256,
                                              "expires_at": expires.isoformat()})
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
            ctx.write_on_commit(lambda: Approval.objects.filter(pk=approval.pk).update(
                status=Approval.Status.VOID))
            return Outcome(to=S.FAILED, reason="approval_void",
                           detail="patch changed after approval")
        return Outcome(to=S.CREATING_PR)
    return Outcome(noop=True)


# --- creating_pr -----------------------------------------------------------------------------


def step_creating_pr(ctx: StepContext) -> Outcome:
    """Commit, push and open (or update) the task's single pull request; each part repeats
    safely. A dry run stops before anything leaves the sandbox."""
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    if ctx.task.execution_mode == "dry_run":
        ctx.emit("agent.pr.skipped", {"reason": "dry_run", "patch_id": patch.id})
        return Outcome(to=S.COMPLETED)
    from runs.gitproviders.base import branch_commit

    repository = ctx.repository
    provider = git_provider_for(repository.provider)
    sandbox = _sandbox(ctx)
    branch = ctx.run.branch
    base_branch = ctx.task.target_branch or repository.default_branch
    title = f"agent: {ctx.task.instruction.splitlines()[0][:80]}"
    ctx.emit("agent.pr.creation.requested", {"branch": branch, "base": base_branch})
    ctx.check_cancelled()
    try:
        head_sha = branch_commit(sandbox=sandbox, branch=branch, message=title)
        provider.branch_push(repository=repository, sandbox=sandbox, branch=branch)
        info = provider.pull_request_ensure(
            repository=repository, branch=branch, base_branch=base_branch, title=title,
            body=f"{ctx.task.instruction}\n\nRun {ctx.run.id} (attempt {patch.attempt_no}).",
            head_sha=head_sha,
        )
    except SandboxError as exc:
        raise StepFailed("pr_creation_failed", str(exc)) from exc

    def record() -> None:
        PullRequest.objects.update_or_create(
            task=ctx.task, provider=provider.name,
            defaults={"branch": branch, "base_branch": base_branch, "number": info.number,
                      "url": info.url, "head_sha": head_sha, "title": title,
                      "last_run": ctx.run},
        )

    ctx.write_on_commit(record)
    existed = PullRequest.objects.filter(task=ctx.task, provider=provider.name).exists()
    kind = "updated" if existed or not info.created else "created"
    ctx.emit(f"agent.pr.{kind}", {"number": info.number, "url": info.url, "branch": branch,
                                  "head_sha": head_sha})
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
