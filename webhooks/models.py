"""Webhook deliveries as received, deduplicated by provider, hook and delivery id."""

from __future__ import annotations

from django.db import models


class WebhookReceipt(models.Model):
    class Status(models.TextChoices):
        RECEIVED = "received"
        PROCESSED = "processed"
        IGNORED = "ignored"
        FAILED = "failed"

    provider = models.CharField(max_length=16)
    # Hook id and delivery id together: one GitHub event can reach two hooks with the
    # same delivery GUID.
    delivery_id = models.CharField(max_length=300)
    hook_id = models.CharField(max_length=100, blank=True)
    event = models.CharField(max_length=100)
    action = models.CharField(max_length=100, blank=True)
    headers = models.JSONField(default=dict)
    payload = models.JSONField(default=dict)
    # The repositories whose secret verified the delivery: processing acts on these only.
    repository_ids = models.JSONField(default=list, blank=True)
    size_bytes = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RECEIVED)
    status_reason = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    received_at = models.DateTimeField(auto_now_add=True)
    # Timings: intake (request to commit), the last processing attempt, and its length.
    intake_ms = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    processing_ms = models.PositiveIntegerField(default=0)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "hook_id", "delivery_id"], name="receipt_unique_delivery"
            ),
        ]
        indexes = [
            models.Index(fields=["-received_at"], name="receipt_received"),
            models.Index(fields=["status", "-received_at"], name="receipt_status"),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.delivery_id} {self.event}"


class WebhookAction(models.Model):
    """A semantic key (this comment, this review, this CI failure) that was acted on once.

    Delivery ids dedupe retries of one delivery; the same comment can still arrive under a
    new delivery id (a second hook, a manual "resend" of an old event from another app).
    The key is inserted in the same transaction as the command it guards, so the command
    happens at most once per key.
    """

    provider = models.CharField(max_length=16)
    key = models.CharField(max_length=300)
    receipt = models.ForeignKey(
        WebhookReceipt, null=True, blank=True, on_delete=models.SET_NULL, related_name="actions"
    )
    outcome = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "key"], name="webhookaction_unique_key"),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.key}"


class CiResult(models.Model):
    """A completed CI run (check suite, check run, workflow run, pipeline) for a commit."""

    class Kind(models.TextChoices):
        CHECK_SUITE = "check_suite"
        CHECK_RUN = "check_run"
        WORKFLOW_RUN = "workflow_run"
        PIPELINE = "pipeline"

    provider = models.CharField(max_length=16)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    external_id = models.CharField(max_length=100)
    repository = models.ForeignKey(
        "runs.Repository", on_delete=models.CASCADE, related_name="ci_results", db_index=False
    )
    pull_request = models.ForeignKey(
        "runs.PullRequest",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="ci_results",
        db_index=False,
    )
    head_sha = models.CharField(max_length=64)
    head_branch = models.CharField(max_length=300, blank=True)
    name = models.CharField(max_length=300, blank=True)
    conclusion = models.CharField(max_length=32)
    summary = models.TextField(blank=True)
    url = models.CharField(max_length=1000, blank=True)
    # Hash of what failed (kind, name, conclusion, summary), not of the commit: the same
    # failure after a follow-up push must not start another follow-up.
    fingerprint = models.CharField(max_length=64, blank=True)
    followup_requested = models.BooleanField(default=False)
    receipt = models.ForeignKey(
        WebhookReceipt, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # A re-run of the same check on the same commit is a new result only if its
            # conclusion changed; a redelivery of the same result is not.
            models.UniqueConstraint(
                fields=["repository", "provider", "kind", "external_id", "head_sha", "conclusion"],
                name="ciresult_unique",
            ),
        ]
        indexes = [models.Index(fields=["pull_request", "head_sha"], name="ciresult_pr_head")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} {self.conclusion} @{self.head_sha[:8]}"
