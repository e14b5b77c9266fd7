"""The console's tenant pages: workspaces, their spend, repositories and API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.console import OperatorAdmin
from runs.admin.identities import repository_webhook_path, webhook_secret_rotate
from runs.models import ApiToken, Membership, Repository, Workspace, WorkspaceSpend


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Workspace)
class WorkspaceAdmin(OperatorAdmin):
    deletable = True
    list_display = ("slug", "name", "max_active_runs", "daily_cost_budget_usd", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


@admin.register(WorkspaceSpend)
class WorkspaceSpendAdmin(OperatorAdmin):
    """What each workspace's daily cost budget is held to: model spend per UTC day.

    Written only with the model turn that costs it; nobody edits, adds or deletes a
    row by hand, or a budget would stop meaning what it says.
    """

    list_display = ("day", "workspace", "cost_usd", "budget_usd", "updated_at")
    list_select_related = ("workspace",)
    list_filter = ("workspace",)
    ordering = ("-day", "workspace")
    date_hierarchy = "day"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="daily budget")
    def budget_usd(self, obj: WorkspaceSpend) -> str:
        budget = obj.workspace.daily_cost_budget_usd
        return "-" if budget is None else f"{budget}"


@admin.register(Repository)
class RepositoryAdmin(OperatorAdmin):
    deletable = True
    list_display = (
        "name",
        "workspace",
        "provider",
        "external_id",
        "default_branch",
        "max_active_runs",
    )
    list_select_related = ("workspace",)
    list_filter = ("provider", "workspace")
    search_fields = ("name", "external_id", "clone_url")
    # Never shown or typed in a form: made by the rotate action, shown once.
    exclude = ("webhook_secret",)
    actions = ["rotate_webhook_secret"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("webhook_url", "webhook_secret_state")

    @admin.display(description="webhook URL")
    def webhook_url(self, obj: Repository) -> str:
        return repository_webhook_path(obj) if obj.pk else "-"

    @admin.display(description="webhook secret")
    def webhook_secret_state(self, obj: Repository) -> str:
        return "set" if obj.webhook_secret else "not set (deliveries are refused)"

    @admin.action(
        description="Rotate the webhook secret (shown once)",
        permissions=["rotate_webhook_secret"],
    )
    def rotate_webhook_secret(self, request: HttpRequest, queryset: QuerySet) -> Any:
        return webhook_secret_rotate(self, request, queryset)

    def has_rotate_webhook_secret_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)


@admin.register(ApiToken)
class ApiTokenAdmin(OperatorAdmin):
    deletable = True
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    list_select_related = ("user",)
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
