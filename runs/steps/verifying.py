"""verifying: the repository's test command on exactly the patch."""

from __future__ import annotations

from django.conf import settings

from runs.agent.artifacts import artifact_create, redact
from runs.agent.environment import environment_problem
from runs.agent.sandbox import CommandCancelled, WorkspaceTooLarge
from runs.agent.verify import verification_classify, verification_summary
from runs.engine import Outcome, RunCancelled, StepContext, StepFailed
from runs.models import Patch, VerificationAttempt
from runs.steps.common import (
    S,
    _restore,
    _retry_with_feedback,
    environment_failed,
    test_command_of,
)


def step_verifying(ctx: StepContext) -> Outcome:
    """Run the repository's test command on exactly the patch; categorise the outcome."""
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    command = test_command_of(ctx)
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
        except WorkspaceTooLarge as exc:
            raise StepFailed("workspace_too_large", str(exc)) from exc
        problem = environment_problem(result)
        if problem is not None:
            # No patch could fix what the sandbox lacks: the run ends now, without
            # spending the agent's attempts on it.
            raise environment_failed(
                ctx,
                "environment_error",
                f"the tests could not run: {problem}",
                stage="verification",
                command=command,
                output=result.output,
            )
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
