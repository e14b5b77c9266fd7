"""Webhook deliveries as received: read-only, with a reprocess action."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.console import ReadOnlyQueueAdmin, pretty_json, status_badge
from webhooks.models import CiResult, WebhookAction, WebhookReceipt
from webhooks.services import webhook_receipt_reprocess

# Headers that could carry credentials are masked even in the operator's view.
SENSITIVE_HEADERS = (
    "authorization",
    "cookie",
    "x-gitlab-token",
    "x-hub-signature",
    "x-hub-signature-256",
)


def headers_masked(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        name: ("•••" if name.lower() in SENSITIVE_HEADERS else value)
        for name, value in headers.items()
    }


@admin.register(WebhookReceipt)
class WebhookReceiptAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "delivery_id",
        "provider",
        "event",
        "action",
        "status_col",
        "attempts",
        "short_reason",
        "received_at",
        "processed_at",
    )
    list_filter = ("status", "provider", "event")
    search_fields = ("=delivery_id", "event", "action", "status_reason")
    ordering = ("-received_at",)
    readonly_fields = (
        "provider",
        "delivery_id",
        "hook_id",
        "event",
        "action",
        "status",
        "status_reason",
        "error_pre",
        "attempts",
        "received_at",
        "processed_at",
        "headers_pretty",
        "payload_pretty",
    )
    exclude = ("headers", "payload", "error")
    actions = ["reprocess"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("payload", "headers")

    @admin.display(description="reason")
    def short_reason(self, obj: WebhookReceipt) -> str:
        return (obj.status_reason or obj.error)[:120]

    @admin.display(description="status", ordering="status")
    def status_col(self, obj: WebhookReceipt) -> str:
        return status_badge(obj.status)

    @admin.display(description="headers")
    def headers_pretty(self, obj: WebhookReceipt) -> str:
        return pretty_json(headers_masked(obj.headers or {}))

    @admin.display(description="payload")
    def payload_pretty(self, obj: WebhookReceipt) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="error")
    def error_pre(self, obj: WebhookReceipt) -> str:
        return pretty_json(obj.error) if obj.error else "-"

    @admin.action(description="Reprocess selected deliveries", permissions=["operate"])
    def reprocess(self, request: HttpRequest, queryset: QuerySet) -> None:
        by = request.user.get_username()

        def operation(receipt: WebhookReceipt) -> tuple[bool, str]:
            result = webhook_receipt_reprocess(receipt=receipt, by=by)
            # The service may answer with a flag or with the receipt it re-queued.
            done = bool(result) if isinstance(result, bool) or result is None else True
            return done, "" if done else f"not reprocessable ({receipt.status})"

        self.act(request, queryset, verb="Reprocess", operation=operation)


@admin.register(WebhookAction)
class WebhookActionAdmin(ReadOnlyQueueAdmin):
    list_display = ("key", "provider", "outcome", "receipt", "created_at")
    list_select_related = ("receipt",)
    list_filter = ("provider",)
    search_fields = ("=key", "outcome")
    ordering = ("-created_at",)


@admin.register(CiResult)
class CiResultAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "name",
        "kind",
        "conclusion",
        "repository",
        "pull_request",
        "short_sha",
        "followup_requested",
        "created_at",
    )
    list_select_related = ("repository", "pull_request")
    list_filter = ("conclusion", "kind", "provider", "followup_requested")
    search_fields = ("=head_sha", "name", "head_branch")
    ordering = ("-created_at",)

    @admin.display(description="head")
    def short_sha(self, obj: CiResult) -> str:
        return obj.head_sha[:10]
