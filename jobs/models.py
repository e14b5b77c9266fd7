"""Delivery bookkeeping: the outbox, consumer dedup and dead letters."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class OutboxEvent(models.Model):
    """A CloudEvent waiting to be published; written in the same transaction as its fact."""

    # bigserial: the relay publishes a partition in id order, which is commit order for
    # rows of one run because each run's events are appended under its row lock.
    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    type = models.CharField(max_length=100)
    partition_key = models.CharField(max_length=64)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    available_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # The relay only ever looks at pending rows; the index stays as small as
            # the backlog instead of growing with history.
            models.Index(
                fields=["id"], condition=Q(published_at__isnull=True), name="outbox_pending"
            ),
            models.Index(fields=["partition_key", "id"], name="outbox_partition"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class ProcessedEvent(models.Model):
    """A consumer's receipt for an event: inserted with the consumer's side effect."""

    consumer = models.CharField(max_length=100)
    event_id = models.UUIDField()
    processed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The natural key; a surrogate id keeps the row editable in the admin, which
        # does not support composite primary keys.
        constraints = [
            models.UniqueConstraint(fields=["consumer", "event_id"], name="processed_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer}:{self.event_id}"


class DeadLetter(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        REQUEUED = "requeued"
        DISCARDED = "discarded"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    task_name = models.CharField(max_length=200)
    task_id = models.CharField(max_length=200, blank=True)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    queue = models.CharField(max_length=64, blank=True)
    exception = models.TextField()
    traceback = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    recoveries = models.PositiveIntegerField(default=0)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    workspace_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["-last_failed_at"], condition=Q(status="open"), name="deadletter_open"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} ({self.status})"
