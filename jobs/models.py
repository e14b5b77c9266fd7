"""Delivery bookkeeping: the outbox, consumer dedup and dead letters."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from jobs.ids import new_id


class OutboxEvent(models.Model):
    """A CloudEvent waiting to be published; written in the same transaction as its fact."""

    # bigserial: the relay publishes a partition in id order, which is commit order for
    # rows of one run because each run's events are appended under its row lock.
    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=new_id, unique=True, editable=False)
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
            # The one reader of a partition's published history: the replay of a deferred
            # submission, which reads its deferral (api.selectors.submission_outcome).
            # Indexing only those rows spares every other insert an index entry.
            models.Index(
                fields=["partition_key", "id"],
                condition=Q(type="agent.task.deferred"),
                name="outbox_deferred",
            ),
            # The relay's head-of-partition test ("no earlier pending row in this
            # partition") only needs pending rows, however long the partition's history.
            models.Index(
                fields=["partition_key", "id"],
                condition=Q(published_at__isnull=True),
                name="outbox_pending_partition",
            ),
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


class EventSubscription(models.Model):
    """An outgoing HTTP subscription: a workspace's endpoint that receives its events.

    Deliveries are signed like GitHub signs its webhooks (``X-Hub-Signature-256``: an
    HMAC-SHA256 of the raw body with ``secret``), so receivers can reuse their code.
    """

    # The workspace whose events it receives: a plain key, jobs owns no foreign key into
    # the domain (docs/design.md §2).
    workspace_id = models.BigIntegerField(db_index=True)
    url = models.URLField(max_length=1000)
    secret = models.CharField(max_length=200)
    # Exact types or prefixes ending in "*" ("agent.run.*"); empty means every event.
    event_types = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["workspace_id"], condition=Q(active=True), name="subscription_active"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id} -> {self.url}"

    def wants(self, event_type: str) -> bool:
        if not self.event_types:
            return True
        for pattern in self.event_types:
            if pattern.endswith("*"):
                if event_type.startswith(pattern[:-1]):
                    return True
            elif pattern == event_type:
                return True
        return False


class WorkspaceDailyCost(models.Model):
    """Model spend per workspace and UTC day, summed from agent.model.turn.completed."""

    # A plain key (docs/design.md §2); the unique constraint below is its index.
    workspace_id = models.BigIntegerField()
    day = models.DateField()
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    model_turns = models.PositiveIntegerField(default=0)
    # The newest event time counted; kept with GREATEST so late events cannot move it back.
    last_event_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace_id", "day"], name="daily_cost_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id} {self.day}: ${self.cost_usd}"


class Notification(models.Model):
    """An outgoing notification (e.g. a comment on the GitHub issue that started a task).

    Unique on (event, channel): the idempotency key of docs/design.md §6. A row that exists but
    is not SENT means an earlier attempt may or may not have reached the provider; the
    sender looks for its marker there before posting again.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        SKIPPED = "skipped"

    event_id = models.UUIDField()
    channel = models.CharField(max_length=64)
    target = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Held across the provider call: a duplicate arriving meanwhile waits instead of
    # posting a second time; a sender that died lets it lapse.
    lease_until = models.DateTimeField(null=True, blank=True)
    external_id = models.CharField(max_length=200, blank=True)
    external_url = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event_id", "channel"], name="notification_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.event_id} ({self.status})"


class WorkerHeartbeat(models.Model):
    """A Celery worker's last sign of life, written by the worker itself every few seconds.

    The console and ``/readyz`` read these rows instead of asking the broker (a
    broadcast ping blocks for its whole timeout). A worker is alive while its last
    heartbeat is recent and it has not said goodbye.
    """

    name = models.CharField(max_length=300, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class WorkItem(models.Model):
    """One unit of work that is not a run step: its row says what is still to do.

    The Celery message (``jobs.work`` with this id) only wakes a worker; ``woken_at``
    records when the last wake-up was due, so the sweep re-sends only what is overdue
    and not in flight, and a backlog never multiplies messages. A claim sets
    ``lease_until``; a lease found expired on the next claim means the previous worker
    died holding it, counted in ``crashes`` (poison detection).
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        DEAD = "dead"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=64)
    # Unique per kind: the work's natural idempotency key (receipt id, consumer + event).
    key = models.CharField(max_length=300)
    args = models.JSONField(default=dict)
    queue = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    due_at = models.DateTimeField()
    woken_at = models.DateTimeField(null=True, blank=True)
    wakes = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    claim = models.CharField(max_length=64, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    crashes = models.PositiveIntegerField(default=0)
    # Times its handler deferred (WorkDeferred) and gave back the attempt. Its default is the
    # database's too: an INSERT written before the column (a process not yet upgraded)
    # still works.
    deferrals = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True)
    # The trace the work belongs to (its event's, or its producer's), whoever wakes it.
    traceparent = models.CharField(max_length=55, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "key"], name="workitem_unique_key"),
        ]
        indexes = [
            # The sweep looks only at pending rows: the index is as small as the backlog.
            models.Index(fields=["due_at"], condition=Q(status="pending"), name="workitem_pending"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key} ({self.status})"
