"""judging: rule checks, the optional model judge, and the approval request."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from runs.agent.judge import (
    DEFAULT_MAX_DIFF_LINES,
    Verdict,
    judge_model_parse,
    judge_rules,
    task_asks_for_fix,
    tests_weakened_only,
    verdict_combine,
)
from runs.agent.sandbox import SandboxError
from runs.agent.steering import patch_steering_changes, runner_tampering
from runs.agent.turns import turn_obtain
from runs.agent.workspace import platform_repository
from runs.models import Approval, JudgeAttempt, Patch
from runs.protocol import Outcome, StepContext, StepFailed
from runs.steps.common import S, _retry_with_feedback

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


def _steering(ctx: StepContext, diff_text: str, files: list[str]) -> list[dict[str, str]]:
    """The patch's files that can change how tests are found or run, and those whose
    added lines reach into the test runner (runs.agent.steering)."""
    try:
        _, changes = patch_steering_changes(
            git_dir=platform_repository(ctx.run),
            base=ctx.run.base_commit,
            diff=diff_text,
            files=files,
            test_command=ctx.repository.test_command,
        )
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc
    named = {change.path for change in changes}
    changes += [c for c in runner_tampering(diff_text) if c.path not in named]
    return [change.as_dict() for change in changes]


def _tests_weakened_rule(ctx: StepContext, diff_text: str, rules: Verdict) -> Verdict:
    """A fix that only weakens tests goes back to the model, before any human sees it."""
    if not task_asks_for_fix(instruction=ctx.task.instruction, task_type=ctx.task.task_type):
        return rules
    finding = tests_weakened_only(diff_text)
    if finding is None:
        return rules
    return verdict_combine([rules, Verdict("revise", [finding])])


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
        steering=_steering(ctx, diff_text, list(patch.files_changed)),
    )
    rules = _tests_weakened_rule(ctx, diff_text, rules)
    verdicts = [("rules", rules)]
    if rules.verdict != "block":
        model = _model_judge(ctx, diff_text)
        if model is not None:
            verdicts.append(("model", model))
    _judgements_record(ctx, patch, verdicts)
    worst = verdict_combine([v for _, v in verdicts])
    if worst.verdict == "block":
        rules_hit = ", ".join(sorted({str(f.get("rule")) for f in worst.findings}))
        raise StepFailed("judge_blocked", f"blocked by: {rules_hit}")
    if worst.verdict == "revise":
        return _retry_with_feedback(
            ctx,
            reason="judge_revise",
            feedback="A reviewer asks for changes: "
            + "; ".join(
                str(f["reason"]) if f.get("reason") else json.dumps(f) for f in worst.findings
            ),
        )
    flagged_tests = any(f.get("rule") == "tests_modified" for f in worst.findings)
    # Whatever the mode: what the patch does to its own verification is for a human.
    steered = any(f.get("severity") == "approval" for f in worst.findings)
    if (
        ctx.task.execution_mode == "supervised_pr"
        or ctx.task.risk_level == "high"
        or steered
        or (flagged_tests and settings.TESTS_MODIFIED_REQUIRES_APPROVAL)
    ):
        reason = (
            "test_configuration" if steered else "tests_modified" if flagged_tests else "policy"
        )
        return _approval_request(ctx, patch, reason=reason)
    return Outcome(to=S.CREATING_PR)


def _judgements_record(ctx: StepContext, patch: Patch, verdicts: list[tuple[str, Verdict]]) -> None:
    """Each judge's verdict on the patch: its row (once per run, patch and judge) and its
    ``agent.judge.completed`` event."""
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


def _approval_request(ctx: StepContext, patch: Patch, *, reason: str) -> Outcome:
    """The patch waits for a person: a pending approval that expires after
    APPROVAL_TTL_SECONDS, and its ``agent.approval.requested`` event."""
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
            "reason": reason,
        },
    )
    return Outcome(to=S.AWAITING_APPROVAL, wait=True)
