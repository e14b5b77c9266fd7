"""Tenants and what they own: workspaces, members, API tokens, linked provider
accounts and repositories with their policy defaults."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

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
