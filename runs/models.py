"""Tenants, repositories, tasks, runs and everything a run leaves behind."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from jobs import tracing
from jobs.ids import new_id, short_id
from runs import priorities
from runs.repositories import CloneUrlRefused, clone_url_check

if TYPE_CHECKING:
    from django.contrib.auth.models import User

DEFAULT_FORBIDDEN_PATHS = [".github/workflows/**", ".env*", "*.pem"]


def default_setup_cache_paths() -> list[str]:
    return [".venv"]


def default_setup_lock_files() -> list[str]:
    return [
        "requirements*.txt",
        "pyproject.toml",
        "setup.py",
        "setup.cfg",
        "poetry.lock",
        "uv.lock",
        "Pipfile.lock",
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "go.sum",
        "Cargo.lock",
        "Gemfile.lock",
    ]


def default_forbidden_paths() -> list[str]:
    return list(DEFAULT_FORBIDDEN_PATHS)


# Ordinary read, search, build and test commands. This list is policy (a repository may
# narrow it), not a security boundary: ``python -c`` runs anything, and the sandbox is
# what contains a command.
DEFAULT_ALLOWED_COMMANDS = (
    *("python", "python3", "pytest", "pip", "pip3", "uv", "tox", "nox", "coverage"),
    *("git", "ls", "cat", "head", "tail", "wc", "sed", "awk", "grep", "egrep", "rg", "find"),
    *("tree", "diff", "cmp", "sort", "uniq", "cut", "tr", "xargs", "file", "stat", "du"),
    *("pwd", "which", "env", "printf", "mkdir", "touch", "cp", "mv", "rm", "ln", "chmod"),
    *("basename", "dirname", "realpath", "readlink", "tee", "nl", "od", "xxd", "sleep"),
    *("make", "cmake", "ninja", "gcc", "cc", "g++", "clang", "ld"),
    *("node", "npm", "npx", "yarn", "pnpm", "tsc", "jest", "mocha", "eslint", "deno", "bun"),
    *("go", "gofmt", "cargo", "rustc", "rustfmt", "java", "javac", "mvn", "gradle"),
    *("ruby", "bundle", "rake", "rspec", "php", "composer", "dotnet", "perl", "bash", "sh"),
)


def default_allowed_commands() -> list[str]:
    return list(DEFAULT_ALLOWED_COMMANDS)


class Workspace(models.Model):
    """A tenant: its members, its repositories and the limits that admission enforces."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    max_active_runs = models.PositiveIntegerField(default=10)
    # Spend allowed per UTC day across all runs of the workspace; 0 means unlimited.
    daily_cost_budget_usd = models.DecimalField(
        max_digits=12, decimal_places=4, default=Decimal("0")
    )

    class ApprovalBy(models.TextChoices):
        APPROVERS = "approvers", "members with the approver or admin role"
        MEMBERS = "members", "any member"

    # Who may approve or reject a patch of this workspace's runs.
    approval_by = models.CharField(
        max_length=16, choices=ApprovalBy.choices, default=ApprovalBy.APPROVERS
    )
    # Whether whoever asked for a high-risk task may approve its patch themselves.
    approval_self_high_risk = models.BooleanField(default=False)
    # A name from settings.MODEL_PROFILES; blank uses the installation's default.
    model_profile = models.CharField(max_length=100, blank=True)
    # Its share of the worker slots against other workspaces with runs (runs.fairness).
    weight = models.PositiveSmallIntegerField(default=1)
    # Active runs allowed per task type, e.g. {"dependency_upgrade": 5}; absent: no limit.
    task_type_limits = models.JSONField(default=dict, blank=True)
    members: models.ManyToManyField[User, Membership] = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="workspaces"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        APPROVER = "approver"
        ADMIN = "admin"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"


class ApiToken(models.Model):
    """A per-user API token; only a SHA-256 of the secret is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ProviderIdentity(models.Model):
    """A git provider account (by its numeric user id on one provider host) that speaks
    for a platform user in one workspace: ``/agent approve`` and ``/agent reject``
    comments by that account are decided as that user, under the workspace's approval
    policy. Scoped to the workspace, so a workspace's admin can link its members without
    handing their power in any other workspace to anyone."""

    class Provider(models.TextChoices):
        GITHUB = "github"
        GITLAB = "gitlab"

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="provider_identities", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_identities"
    )
    provider = models.CharField(max_length=16, choices=Provider.choices)
    # The provider's web host (github.com, a GitHub Enterprise or GitLab host).
    host = models.CharField(max_length=255)
    # The account's numeric id: a login can be renamed and taken by someone else.
    external_user_id = models.CharField(max_length=64)
    login = models.CharField(max_length=200, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "provider", "host", "external_user_id"],
                name="provideridentity_unique_account",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.login or self.external_user_id} -> {self.user_id}"


class Repository(models.Model):
    class Provider(models.TextChoices):
        LOCAL = "local"
        GITHUB = "github"
        GITLAB = "gitlab"

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="repositories", db_index=False
    )
    name = models.CharField(max_length=200)
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.LOCAL)
    # Provider-side identity, e.g. "octo-org/hello-world" on GitHub or the GitLab path.
    external_id = models.CharField(max_length=300, blank=True, db_index=True)
    clone_url = models.CharField(max_length=1000, help_text="URL or local path to clone from")
    default_branch = models.CharField(max_length=200, default="main")
    test_command = models.CharField(
        max_length=1000,
        blank=True,
        help_text="Blank: detected at each run from the repository's files "
        "(pytest, unittest, npm test, go test, cargo test), with a setup installing "
        "the test dependencies when setup_command is blank too.",
    )
    # Run in the sandbox before the agent starts (e.g. "python3 -m venv .venv &&
    # .venv/bin/pip install -e ."); its result is cached per lock-file hash and mounted
    # read-only into every later sandbox of the repository.
    setup_command = models.CharField(max_length=2000, blank=True)
    # The setup phase only; commands of the agent never have a network. On by default:
    # the default (detected) setup installs the repository's test dependencies.
    setup_network = models.BooleanField(default=True)
    setup_cache_paths = models.JSONField(default=default_setup_cache_paths, blank=True)
    setup_lock_files = models.JSONField(default=default_setup_lock_files, blank=True)
    webhook_secret = models.CharField(max_length=200, blank=True)
    forbidden_paths = models.JSONField(default=default_forbidden_paths, blank=True)
    allowed_commands = models.JSONField(default=default_allowed_commands, blank=True)
    max_active_runs = models.PositiveIntegerField(default=3)
    # The last pull request number the local provider handed out (see gitproviders.local).
    local_pr_seq = models.PositiveIntegerField(default=0, editable=False)
    # A name from settings.MODEL_PROFILES; blank uses the workspace's.
    model_profile = models.CharField(max_length=100, blank=True)
    # Pause after planning until a person accepts, edits or rejects the plan.
    plan_review = models.BooleanField(default=False)
    # The priority class of its tasks that name none (webhooks, API, admin).
    default_priority = models.SmallIntegerField(
        choices=priorities.CHOICES, default=priorities.DEFAULT
    )
    # Active runs allowed per task type in this repository; absent: no limit.
    task_type_limits = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "repositories"
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="repository_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The admin is staff only: staff rules for the clone URL (runs/repositories)."""
        try:
            clone_url_check(self.clone_url, staff=True)
        except CloneUrlRefused as exc:
            raise ValidationError({"clone_url": str(exc)}) from exc


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


class WorkspaceSpend(models.Model):
    """Model spend of a workspace in one UTC day: what its daily cost budget is held to.

    Added to in the transaction that stores the model turn (``workspace_spend_add``), so
    a turn's cost counts exactly when the turn is stored: a turn whose transaction rolls
    back (a lost lease, a second attempt at the same turn) adds nothing. Admission reads
    one row by its unique key, whatever the number of runs. (``jobs.WorkspaceDailyCost``
    is the report the cost consumer sums from the events, tokens and turns included;
    it trails the commits by the relay's lag, so budgets are not held to it.)
    """

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="spend", db_index=False
    )
    day = models.DateField()
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "day"], name="workspace_spend_day"),
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id} {self.day}: ${self.cost_usd}"


class ActiveRunCount(models.Model):
    """Active runs of a workspace (``repository_id`` 0) or of one of its repositories: the
    sum of the rows of every ``stripe``. What admission reads on PostgreSQL, in place of a
    scan of the active runs that grew with their number.

    Written only by the triggers on runs (migration 0020), in the transaction that inserts
    a run, moves it between an active and a terminal status or deletes it, so the sum at
    any snapshot is the count of the active runs at that snapshot. A submission that holds
    an admission lane adds to its lane's stripe, which nobody else holding a lane of the
    workspace writes; other writers add to a stripe of their backend's, so concurrent
    submissions and run ends do not wait on one row. No foreign keys: the rows of a
    deleted workspace are left at zero.
    """

    pk = models.CompositePrimaryKey("workspace_id", "repository_id", "stripe")
    workspace_id = models.BigIntegerField()
    repository_id = models.BigIntegerField()
    stripe = models.SmallIntegerField()
    runs = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.repository_id}/{self.stripe}: {self.runs}"


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


# Rows declared in modules of their own (they name Run by string, so those modules import
# nothing from this one): a person's answers (runs.input_models) and the recorded
# history's own rows (runs.replay); imported here so Django registers them with the app.
from runs.input_models import InputRequest  # noqa: E402
from runs.replay.records import RunFoldSnapshot, RunImport, RunReplay  # noqa: E402

__all__ = ["InputRequest", "RunFoldSnapshot", "RunImport", "RunReplay"]
