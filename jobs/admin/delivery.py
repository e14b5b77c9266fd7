"""The delivery tables: the outbox, consumers' receipts, subscriptions, notifications,
work items and the cost report."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from jobs.admin.console import OperatorAdmin, ReadOnlyQueueAdmin, age_text, pretty_json, since
from jobs.models import (
    EventSubscription,
    Notification,
    OutboxEvent,
    ProcessedEvent,
    WorkItem,
    WorkspaceDailyCost,
)
from jobs.relay import relay_wake

# --- outbox -------------------------------------------------------------------------------


class OutboxStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("pending", "pending"),
            ("failing", "failing (retried, with error)"),
            ("published", "published"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "pending":
            return queryset.filter(published_at__isnull=True)
        if self.value() == "failing":
            return queryset.filter(published_at__isnull=True, attempts__gt=0)
        if self.value() == "published":
            return queryset.filter(published_at__isnull=False)
        return queryset


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "id",
        "type",
        "partition_key",
        "state",
        "lag",
        "attempts",
        "short_error",
        "created_at",
    )
    list_filter = (OutboxStateFilter, "type")
    search_fields = ("=partition_key", "=event_id", "type")
    ordering = ("-id",)
    readonly_fields = (
        "id",
        "event_id",
        "type",
        "partition_key",
        "payload_pretty",
        "created_at",
        "available_at",
        "published_at",
        "attempts",
        "last_error",
    )
    exclude = ("payload",)
    actions = ["republish"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The payload is the biggest column and the list never shows it.
        return super().get_queryset(request).defer("payload")

    @admin.display(description="state")
    def state(self, obj: OutboxEvent) -> str:
        if obj.published_at:
            return "published"
        return "failing" if obj.attempts else "pending"

    @admin.display(description="lag")
    def lag(self, obj: OutboxEvent) -> str:
        if obj.published_at:
            return age_text((obj.published_at - obj.created_at).total_seconds())
        return since(obj.created_at)

    @admin.display(description="error")
    def short_error(self, obj: OutboxEvent) -> str:
        return obj.last_error[:120]

    @admin.display(description="payload")
    def payload_pretty(self, obj: OutboxEvent) -> str:
        return pretty_json(obj.payload)

    @admin.action(description="Republish selected events", permissions=["operate"])
    def republish(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Mark the events pending and available now, then wake the relay.

        Consumers deduplicate by event id (ProcessedEvent), so publishing twice is safe.
        """
        events = list(queryset.only("id", "type", "partition_key"))
        with transaction.atomic():
            changed = OutboxEvent.objects.filter(pk__in=[e.pk for e in events]).update(
                published_at=None, available_at=timezone.now(), last_error=""
            )
            for event in events:
                self.audit(request, event, "republish requested")
            transaction.on_commit(relay_wake)
        self.message_user(
            request, f"Republish: {changed} event(s) queued for the relay.", messages.SUCCESS
        )


# --- processed events -------------------------------------------------------------------------


@admin.register(ProcessedEvent)
class ProcessedEventAdmin(ReadOnlyQueueAdmin):
    list_display = ("consumer", "event_id", "processed_at")
    list_filter = ("consumer",)
    search_fields = ("=event_id", "consumer")
    ordering = ("-processed_at",)
    readonly_fields = ("consumer", "event_id", "processed_at")


# --- delivery to the outside: subscriptions, notifications, cost aggregates -------------------


@admin.register(EventSubscription)
class EventSubscriptionAdmin(OperatorAdmin):
    deletable = True
    list_display = ("url", "workspace_id", "active", "event_types", "description", "created_at")
    list_filter = ("active", "workspace_id")
    search_fields = ("url", "description")
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        # The signing secret is shown to those who may change it, and to no one else.
        if not request.user.is_superuser and "secret" in fields:
            fields.remove("secret")
        return fields


@admin.register(Notification)
class NotificationAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "channel",
        "event_id",
        "status",
        "attempts",
        "target",
        "external_url",
        "created_at",
        "sent_at",
    )
    list_filter = ("status", "channel")
    search_fields = ("=event_id", "target", "external_id")
    ordering = ("-created_at",)


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyQueueAdmin):
    """Work that is not a run step: what is pending, in flight, done or dead."""

    list_display = (
        "kind",
        "key",
        "status",
        "attempts",
        "crashes",
        "deferrals",
        "due_at",
        "woken_at",
        "lease_until",
        "created_at",
    )
    list_filter = ("status", "kind")
    search_fields = ("=key", "kind", "last_error")
    ordering = ("-created_at",)
    readonly_fields = ("args_pretty",)

    @admin.display(description="args")
    def args_pretty(self, obj: WorkItem) -> str:
        return pretty_json(obj.args)


@admin.register(WorkspaceDailyCost)
class WorkspaceDailyCostAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "day",
        "workspace_id",
        "cost_usd",
        "tokens_in",
        "tokens_out",
        "model_turns",
        "last_event_at",
    )
    list_filter = ("workspace_id",)
    ordering = ("-day", "workspace_id")
    date_hierarchy = "day"
