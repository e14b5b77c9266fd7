"""What a run leaves behind: artifacts, model turns, tool calls, patches, their
verifications and judgements, approvals and pull requests."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Q

if TYPE_CHECKING:
    pass
from runs.models.task import Run, Task


class Artifact(models.Model):
    """Large content (prompts, model responses, logs, diffs), referenced from events."""

    class Kind(models.TextChoices):
        PROMPT = "prompt"
        MODEL_REQUEST = "model_request"
        MODEL_RESPONSE = "model_response"
        LOG = "log"
        DIFF = "diff"
        PLAN = "plan"
        CONTEXT = "context"
        OTHER = "other"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    name = models.CharField(max_length=300)
    content_type = models.CharField(max_length=100, default="text/plain")
    content = models.TextField()
    size_bytes = models.PositiveIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


class ModelTurn(models.Model):
    """One answered model call, checkpointed so a recovered run never asks again."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="model_turns", db_index=False
    )
    step_no = models.PositiveIntegerField()
    turn_no = models.PositiveIntegerField()
    purpose = models.CharField(max_length=32, default="act")
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=200)
    response = models.JSONField(default=dict)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    latency_ms = models.PositiveIntegerField(default=0)
    tokens_cached = models.PositiveIntegerField(default=0)
    # The endpoint sent no usage; tokens were estimated from the text.
    usage_estimated = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=32, blank=True)
    # What was wrong with the reply (invalid_tool_call, text_only, length); counts
    # against the model_errors budget.
    problem = models.CharField(max_length=32, blank=True)
    request_artifact = models.ForeignKey(
        Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    response_artifact = models.ForeignKey(
        Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_no", "turn_no"], name="modelturn_unique_step_turn"
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.step_no}.{self.turn_no} ({self.purpose})"


class ToolCall(models.Model):
    class Status(models.TextChoices):
        REQUESTED = "requested"
        DENIED = "denied"
        # The model's call was malformed (unknown tool, bad arguments): never run.
        REJECTED = "rejected"
        STARTED = "started"
        COMPLETED = "completed"
        FAILED = "failed"
        TIMED_OUT = "timed_out"

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    step_no = models.PositiveIntegerField()
    turn_no = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_no", "turn_no", "call_id"], name="toolcall_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} ({self.status})"


class Patch(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="patches", db_index=False)
    attempt_no = models.PositiveIntegerField(default=1)
    diff_sha256 = models.CharField(max_length=64)
    diff_artifact = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+")
    files_changed = models.JSONField(default=list)
    lines_added = models.PositiveIntegerField(default=0)
    lines_removed = models.PositiveIntegerField(default=0)
    # "" when the model finished; "budget" or "loop" when the platform submitted the
    # working copy because turns, cost or time ran out or a loop was stopped.
    submitted_by = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt_no"], name="patch_unique_attempt"),
        ]

    def __str__(self) -> str:
        return f"patch {self.attempt_no} ({self.diff_sha256[:12]})"


class VerificationAttempt(models.Model):
    class Outcome(models.TextChoices):
        PASSED = "passed"
        TEST_FAILURE = "test_failure"
        COMPILE_ERROR = "compile_error"
        TIMEOUT = "timeout"
        ERRORED = "errored"
        # The command succeeded, but fewer tests ran or passed than on the base commit.
        FEWER_TESTS = "fewer_tests"

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="verifications", db_index=False
    )
    patch = models.ForeignKey(Patch, on_delete=models.CASCADE, related_name="verifications")
    verifier = models.CharField(max_length=64, default="test_command")
    command = models.CharField(max_length=1000)
    outcome = models.CharField(max_length=32, choices=Outcome.choices)
    exit_code = models.IntegerField(null=True)
    duration_ms = models.PositiveIntegerField(default=0)
    summary = models.TextField(blank=True)
    log_artifact = models.ForeignKey(
        Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The counts this run and the base commit's run reported ({"counts", "baseline"}),
    # and the patch's files verification took from the base commit ("steering").
    test_report = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "patch", "verifier"], name="verification_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verifier}: {self.outcome}"


class JudgeAttempt(models.Model):
    class Verdict(models.TextChoices):
        ACCEPT = "accept"
        REVISE = "revise"
        BLOCK = "block"

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="judgements", db_index=False
    )
    patch = models.ForeignKey(Patch, on_delete=models.CASCADE, related_name="judgements")
    judge = models.CharField(max_length=64, default="rules")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    score = models.FloatField(null=True, blank=True)
    findings = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "patch", "judge"], name="judge_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.judge}: {self.verdict}"


class Approval(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        VOID = "void"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    patch = models.ForeignKey(Patch, on_delete=models.CASCADE, related_name="approvals")
    # The approval holds only for the exact diff that was shown.
    patch_sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=200, blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=200, blank=True)
    comment = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(status="pending"), name="approval_one_pending"
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"], condition=Q(status="pending"), name="approval_pending"
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.status} ({self.patch_sha256[:12]})"


class PullRequest(models.Model):
    class State(models.TextChoices):
        OPEN = "open"
        MERGED = "merged"
        CLOSED = "closed"

    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="pull_requests", db_index=False
    )
    provider = models.CharField(max_length=16)
    branch = models.CharField(max_length=200)
    base_branch = models.CharField(max_length=200)
    number = models.PositiveIntegerField(null=True, blank=True)
    url = models.CharField(max_length=1000, blank=True)
    head_sha = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    title = models.CharField(max_length=300, blank=True)
    last_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # One PR branch per task; follow-up runs push to it.
            models.UniqueConstraint(fields=["task", "provider"], name="pullrequest_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.provider} PR #{self.number} ({self.branch})"
