"""verifying: the repository's test command on exactly the patch, under the base
commit's test configuration, held against the base commit's own run.

The patch cannot steer its own verification: the command is the registered one; the
patch's files that can change how tests are found or run (runs.agent.steering) are
taken from the base commit for the run; the copy tested is made fresh from the base
commit and the patch, so nothing else the agent left in its working copy is in it; and
the counts the runner reports are compared with the base commit's run of the same
command (made once per run, base commit and command): fewer tests run or passed is a
failure even when the command exits 0.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from runs.agent.artifacts import artifact_create, redact
from runs.agent.environment import environment_problem
from runs.agent.sandbox import (
    CommandCancelled,
    CommandResult,
    LocalSandbox,
    SandboxError,
    WorkspaceTooLarge,
)
from runs.agent.steering import SteeringChange, patch_steering_changes, verification_diff
from runs.agent.verify import (
    SuiteCounts,
    baseline_shortfall,
    suite_counts_parse,
    verification_classify,
    verification_summary,
)
from runs.agent.workspace import platform_repository, workspace_scratch
from runs.models import Patch, VerificationAttempt
from runs.protocol import Outcome, RunCancelled, StepContext, StepFailed
from runs.steps.common import (
    S,
    _retry_with_feedback,
    _setup,
    environment_failed,
    test_command_of,
)

Result = VerificationAttempt.Outcome


def _scratch(ctx: StepContext, name: str, diff: str) -> LocalSandbox:
    try:
        sandbox = workspace_scratch(run=ctx.run, name=name, diff=diff)
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc
    try:
        _setup(ctx, sandbox)
    except BaseException:
        sandbox.remove()
        raise
    return sandbox


def _run_once(ctx: StepContext, sandbox: LocalSandbox, command: str) -> CommandResult:
    """``command`` in ``sandbox``, which is removed afterwards whatever happens."""
    try:
        return sandbox.run(
            command, timeout=settings.COMMAND_TIMEOUT_SECONDS, should_stop=ctx.should_stop
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except WorkspaceTooLarge as exc:
        raise StepFailed("workspace_too_large", str(exc)) from exc
    finally:
        sandbox.remove()


def _counts(result: CommandResult) -> SuiteCounts | None:
    return None if result.timed_out else suite_counts_parse(result.output)


def _baseline(ctx: StepContext, command: str) -> dict[str, Any]:
    """The base commit's own run of ``command``: made once per run, base commit and
    command, and kept in the checkpoint."""
    cached = ctx.checkpoint.get("test_baseline")
    if (
        isinstance(cached, dict)
        and cached.get("base_commit") == ctx.run.base_commit
        and cached.get("command") == command
    ):
        return cached
    result = _run_once(ctx, _scratch(ctx, "base", ""), command)
    _environment_check(ctx, result, command)
    counts = _counts(result)
    log = artifact_create(run=ctx.run, kind="log", name="verification base", content=result.output)
    baseline = {
        "base_commit": ctx.run.base_commit,
        "command": command,
        "exit_code": result.exit_code,
        "counts": counts.as_dict() if counts else None,
        "log_artifact_id": str(log.pk),
    }
    ctx.checkpoint["test_baseline"] = baseline
    return baseline


def _steering(ctx: StepContext, patch: Patch, diff: str) -> tuple[str, list[SteeringChange]]:
    """The diff verification applies, and the patch's files it leaves as the base has them."""
    try:
        git_dir = platform_repository(ctx.run)
        tree, changes = patch_steering_changes(
            git_dir=git_dir,
            base=ctx.run.base_commit,
            diff=diff,
            files=list(patch.files_changed),
            test_command=test_command_of(ctx),
        )
        if not changes:
            return diff, []
        return (
            verification_diff(
                git_dir=git_dir, base=ctx.run.base_commit, tree=tree, changes=changes
            ),
            changes,
        )
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc


def _report_text(report: dict[str, Any]) -> str:
    """What a person and the model read first: the counts, the shortfall, the files
    verification took from the base commit."""
    lines = []

    def said(counts: dict[str, int] | None) -> str:
        if not counts:
            return "no test count in the output"
        return f"{counts['ran']} ran, {counts['passed']} passed, {counts['failed']} failed"

    lines.append(f"Tests: {said(report['counts'])} (base commit: {said(report['baseline'])}).")
    if report.get("shortfall"):
        lines.append(f"Verification failed: {report['shortfall']}.")
    for change in report.get("steering", []):
        lines.append(
            f"Taken from the base commit for verification: {change['path']} ({change['detail']})."
        )
    return "\n".join(lines)


def _environment_check(ctx: StepContext, result: CommandResult, command: str) -> None:
    """No patch can fix what the sandbox lacks: such a run ends now, without spending the
    agent's attempts on it."""
    problem = environment_problem(result)
    if problem is not None:
        raise environment_failed(
            ctx,
            "environment_error",
            f"the tests could not run: {problem}",
            stage="verification",
            command=command,
            output=result.output,
        )


def _verify(ctx: StepContext, patch: Patch, data: dict[str, Any]) -> VerificationAttempt:
    command = test_command_of(ctx)
    diff, steering = _steering(ctx, patch, ctx.checkpoint.get("diff") or "")
    ctx.check_cancelled()
    with ctx.fenced():
        ctx.emit("agent.verification.started", data)
    baseline = _baseline(ctx, command)
    result = _run_once(ctx, _scratch(ctx, f"verify-{patch.attempt_no}", diff), command)
    _environment_check(ctx, result, command)
    outcome = verification_classify(result)
    counts = _counts(result)
    base_counts = SuiteCounts(**baseline["counts"]) if baseline["counts"] else None
    shortfall = baseline_shortfall(base=base_counts, patched=counts)
    if shortfall and counts is None and result.truncated:
        shortfall += "; the output was longer than the limit and its end, the summary, was cut"
    if shortfall and outcome == Result.PASSED:
        outcome = Result.FEWER_TESTS
    report = {
        "counts": counts.as_dict() if counts else None,
        "baseline": baseline["counts"],
        "baseline_log_artifact_id": baseline["log_artifact_id"],
        "shortfall": shortfall,
        "steering": [change.as_dict() for change in steering],
    }
    log = artifact_create(
        run=ctx.run, kind="log", name=f"verification {patch.attempt_no}", content=result.output
    )
    summary = f"{_report_text(report)}\n{verification_summary(result.output)}"
    attempt = VerificationAttempt(
        run=ctx.run,
        patch=patch,
        verifier="test_command",
        command=command,
        outcome=outcome,
        exit_code=result.exit_code,
        duration_ms=result.duration_ms,
        summary=redact(summary),
        log_artifact=log,
        test_report=report,
    )
    ctx.write_on_commit(attempt.save)
    return attempt


def step_verifying(ctx: StepContext) -> Outcome:
    """Run the repository's test command on exactly the patch; categorise the outcome."""
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    command = test_command_of(ctx)
    data = {"patch_id": patch.id, "command": command, "attempt_no": patch.attempt_no}
    existing = VerificationAttempt.objects.filter(
        run=ctx.run, patch=patch, verifier="test_command"
    ).first()
    if existing is None:
        existing = _verify(ctx, patch, data)
    result_data = {
        **data,
        "outcome": existing.outcome,
        "exit_code": existing.exit_code,
        "duration_ms": existing.duration_ms,
        "log_artifact_id": str(existing.log_artifact_id),
        "tests": existing.test_report.get("counts"),
        "baseline": existing.test_report.get("baseline"),
    }
    if existing.outcome == Result.PASSED:
        ctx.emit("agent.verification.passed", result_data)
        return Outcome(to=S.JUDGING)
    kind = "errored" if existing.outcome == Result.ERRORED else "failed"
    ctx.emit(f"agent.verification.{kind}", result_data)
    steering = existing.test_report.get("steering")
    return _retry_with_feedback(
        ctx,
        reason=f"verification_{existing.outcome}",
        feedback=(
            f"The tests failed ({existing.outcome}) after your change. Fix it. "
            "Verification runs the repository's registered test command on a fresh copy of "
            "the base commit plus your patch"
            + (
                ", with the files below as the base commit has them: they can change how "
                "tests are found or run, so keep such changes out of the patch (put fixtures "
                "in the test modules)"
                if steering
                else ""
            )
            + f". Summary of `{command}`:\n{existing.summary}"
        ),
    )
