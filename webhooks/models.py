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
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RECEIVED)
    status_reason = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "hook_id", "delivery_id"], name="receipt_unique_delivery"
            ),
        ]
        indexes = [models.Index(fields=["-received_at"], name="receipt_received")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.delivery_id} {self.event}"
