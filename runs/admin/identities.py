"""The console's side of what proves who: repository webhook secrets and linked
provider accounts (see ``agentplatform.api.views.identities`` for the API's)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from jobs.admin.console import OperatorAdmin
from runs.identities import provider_host, webhook_secret_new
from runs.models import ProviderIdentity, Repository


def repository_webhook_path(repository: Repository) -> str:
    if repository.provider not in (Repository.Provider.GITHUB, Repository.Provider.GITLAB):
        return "-"
    return f"/webhooks/{repository.provider}/{repository.pk}/"


def webhook_secret_rotate(
    modeladmin: OperatorAdmin, request: HttpRequest, queryset: Any
) -> HttpResponse | None:
    """Make a new webhook secret for one repository and show it, once, on its own page
    (never in a message, which would keep it in the session or a cookie)."""
    repositories = list(queryset[:2])
    if len(repositories) != 1:
        modeladmin.message_user(request, "Select exactly one repository.", messages.WARNING)
        return None
    repository = repositories[0]
    if repository_webhook_path(repository) == "-":
        modeladmin.message_user(
            request, "A local repository receives no webhooks.", messages.WARNING
        )
        return None
    secret = webhook_secret_new()
    Repository.objects.filter(pk=repository.pk).update(webhook_secret=secret)
    modeladmin.audit(request, repository, "Rotated the webhook secret")
    response = TemplateResponse(
        request,
        "admin/runs/repository/webhook_secret.html",
        {
            **modeladmin.admin_site.each_context(request),
            "repository": repository,
            "webhook_url": request.build_absolute_uri(repository_webhook_path(repository)),
            "secret": secret,
            "opts": modeladmin.model._meta,
        },
    )
    response["Cache-Control"] = "no-store"
    return response


@admin.register(ProviderIdentity)
class ProviderIdentityAdmin(OperatorAdmin):
    list_display = ("workspace", "user", "provider", "host", "login", "external_user_id")
    list_select_related = ("workspace", "user")
    list_filter = ("provider", "workspace")
    search_fields = ("login", "external_user_id", "user__username")
    autocomplete_fields = ("user",)
    fields = ("workspace", "user", "provider", "host", "external_user_id", "login", "created_by")
    readonly_fields = ("created_by",)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        initial.setdefault("host", provider_host(str(initial.get("provider") or "github")))
        return initial

    def save_model(
        self, request: HttpRequest, obj: ProviderIdentity, form: Any, change: bool
    ) -> None:
        if not change:
            obj.created_by = request.user.get_username()
        super().save_model(request, obj, form, change)
