"""What was asked and each attempt at it: tasks, runs and the runs' timelines."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from jobs import tracing
from jobs.ids import new_id, short_id
from runs import priorities

if TYPE_CHECKING:
    pass
from runs.models.tenants import Repository, Workspace


class Task(models.Model):
    """What was asked. Runs are attempts at it."""

    class Mode(models.TextChoices):
        SUPERVISED_PR = "supervised_pr"
        AUTONOMOUS_PR = "autonomous_pr"
        DRY_RUN = "dry_run"

    class Source(models.TextChoices):
        API = "api"
        ADMIN = "admin"
        WEBHOOK = "webhook"

    class Risk(models.TextChoices):
        LOW = "low"
        MEDIUM = "medium"
        HIGH = "high"

    class Status(models.TextChoices):
        QUEUED = "queued"
        DEFERRED = "deferred"
        RUNNING = "running"
        AWAITING_APPROVAL = "awaiting_approval"
        AWAITING_INPUT = "awaiting_input"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        REJECTED = "rejected"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="tasks", db_index=False
    )
    repository = models.ForeignKey(Repository, on_delete=models.PROTECT, related_name="tasks")
    instruction = models.TextField()
    task_type = models.CharField(max_length=64, default="change")
    risk_level = models.CharField(max_length=16, choices=Risk.choices, default=Risk.LOW)
    execution_mode = models.CharField(
        max_length=32, choices=Mode.choices, default=Mode.AUTONOMOUS_PR
    )
    target_branch = models.CharField(max_length=200, blank=True)
    requested_by = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.API)
    # Where the task came from outside (issue URL, comment id...), for notifications.
    source_ref = models.JSONField(default=dict, blank=True)
    # A class of runs.priorities (lower is more urgent); aging applies on top of it.
    priority = models.SmallIntegerField(choices=priorities.CHOICES, default=priorities.DEFAULT)
    # Plan review for this task: None follows the repository's ``plan_review``.
    plan_review = models.BooleanField(null=True, blank=True, default=None)
    budget = models.JSONField(default=dict, blank=True)
    # The agent's script for the scripted model, or other per-task model options.
    model_options = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.QUEUED)
    status_reason = models.CharField(max_length=500, blank=True)
    # Cumulative over every run of the task (follow-ups included): never reset.
    usage = models.JSONField(default=dict, blank=True)
    # Feedback that arrived while a run was active, batched into the next follow-up.
    pending_feedback = models.TextField(blank=True)
    # W3C trace context of the request or webhook that created the task; its runs' steps
    # and events continue this trace.
    traceparent = models.CharField(
        max_length=55, blank=True, default=tracing.traceparent_current_or_new, editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="task_unique_idempotency_key",
            ),
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="task_ws_created"),
            # The task list's order: newest first across the caller's workspaces.
            models.Index(fields=["-created_at", "id"], name="task_created"),
            # The re-admission queue of a workspace, in the order it is admitted.
            models.Index(
                fields=["workspace", "priority", "created_at"],
                condition=Q(status="deferred"),
                name="task_deferred_queue",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instruction[:60]}"

    def budget_limit(self, name: str) -> float:
        value = self.budget.get(name, settings.TASK_DEFAULT_BUDGET[name])
        return float(value)


# Run.Status's terminal values (runs.state.TERMINAL), in the order the partial indexes of
# active runs spell their condition: admission's count spells it the same way, so
# PostgreSQL matches the index's condition at once instead of proving it value by value.
RUN_TERMINAL_STATUSES = ("completed", "failed", "cancelled", "timed_out")


class Run(models.Model):
    """One attempt at a task, advanced step by step under a fenced lease."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        PREPARING = "preparing"
        CONTEXT_LOADING = "context_loading"
        PLANNING = "planning"
        RUNNING = "running"
        VERIFYING = "verifying"
        JUDGING = "judging"
        AWAITING_APPROVAL = "awaiting_approval"
        AWAITING_INPUT = "awaiting_input"
        CREATING_PR = "creating_pr"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        TIMED_OUT = "timed_out"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own (as every foreign key a unique constraint or index starts with):
    # the unique (task, run_no) index serves lookups by task, and a second index cost an
    # index insert on every run and on every step that changes its status.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="runs", db_index=False)
    # The task's workspace, copied when the run is created (a task never changes
    # workspace): the API scopes and lists runs by workspace without joining every run
    # to its task (see the run_ws_created index).
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="runs", editable=False, db_index=False
    )
    # The task's repository, copied the same way (a task never changes repository):
    # admission counts a repository's active runs from the run_active index alone.
    repository = models.ForeignKey(
        Repository, on_delete=models.PROTECT, related_name="runs", editable=False, db_index=False
    )
    run_no = models.PositiveIntegerField()
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.QUEUED)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    # Incremented on every state commit; a wake-up message names the step it was sent
    # for, so a duplicated or late message finds a different number and does nothing.
    step_no = models.PositiveIntegerField(default=0)
    # The lease: who may write, until when, and the fencing token (attempt) that every
    # write compares, so a worker that lost its lease changes nothing.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the stall sweep last re-sent this run's wake-up, and how many it sent since a
    # worker last took the run: the sweep waits longer after each, so a run whose
    # message is merely queued behind a backlog does not get another every tick.
    woken_at = models.DateTimeField(null=True, blank=True)
    wakes = models.PositiveIntegerField(default=0)
    # The lease generation: +1 each time a worker takes the lease (once per step), so it
    # counts leases, not agent attempts (those are the run's patches).
    attempt = models.PositiveIntegerField(default=0, verbose_name="lease generation")
    recoveries = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=200, blank=True)
    cancel_reason = models.CharField(max_length=500, blank=True)
    base_commit = models.CharField(max_length=64, blank=True)
    branch = models.CharField(max_length=200, blank=True)
    model_profile = models.CharField(max_length=200, blank=True)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    failure_reason = models.CharField(max_length=64, blank=True)
    failure_detail = models.TextField(blank=True)
    # Feedback this run starts from (review comments, CI failure summary).
    feedback = models.TextField(blank=True)
    checkpoint = models.JSONField(default=dict, blank=True)
    last_sequence_no = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "run_no"], name="run_unique_task_run_no"),
            # One active run per task: follow-ups wait for the previous run to end.
            models.UniqueConstraint(
                fields=["task"],
                condition=~Q(status__in=RUN_TERMINAL_STATUSES),
                name="run_one_active_per_task",
            ),
        ]
        indexes = [
            # The reaper reads active runs through a partial index of active runs
            # (run_one_active_per_task, run_active) or this one. No index holds a column the
            # lease writes (lease_owner, lease_until, heartbeat_at, attempt, wakes):
            # PostgreSQL can then make the lease's UPDATE and its renewals HOT updates,
            # which write no index entries; with lease_until indexed, every lease wrote
            # an entry into every index of the table.
            models.Index(fields=["status", "status_changed_at"], name="run_status_changed"),
            # The API lists runs newest first with the id as tie-breaker; an index in
            # exactly that order reads one page instead of sorting every visible run
            # (runs created in one burst share a created_at). Leads with created_at, so
            # time-window reads (today's cost) use it too.
            models.Index(fields=["-created_at", "id"], name="run_created"),
            # A workspace's runs in the list's order: a page, and the list's bounded
            # count, read one range of this index instead of walking every workspace's
            # runs and looking each one's task up.
            models.Index(fields=["workspace", "-created_at", "id"], name="run_ws_created"),
            # Admission's counts of a workspace's and of a repository's active runs read
            # one range of this index (it holds active runs only: ACTIVE's statuses, as
            # admission names them) and stop at the limit, instead of every active run of
            # every workspace through run_status_changed and each one's task.
            models.Index(
                fields=["workspace", "repository"],
                condition=~Q(status__in=RUN_TERMINAL_STATUSES),
                name="run_active",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.short_id} #{self.run_no}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.workspace_id is None and self.task_id is not None:
            self.workspace_id = self.task.workspace_id
        if self.repository_id is None and self.task_id is not None:
            self.repository_id = self.task.repository_id
        super().save(*args, **kwargs)

    @property
    def short_id(self) -> str:
        """The end of the id (its random part), as the console shows a run in a list."""
        return short_id(self.id)


class RunEvent(models.Model):
    """The timeline: facts about a run, gap-free and ordered by sequence_no."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: the unique (run, sequence_no) index serves every lookup by
    # run, and a second one cost an index insert per event.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    sequence_no = models.PositiveIntegerField()
    type = models.CharField(max_length=100)
    data = models.JSONField(default=dict)
    actor = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "sequence_no"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence_no"], name="runevent_unique_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.sequence_no} {self.type}"
