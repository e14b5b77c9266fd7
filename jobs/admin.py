"""Operator views of the delivery tables, and the pieces every console page shares.

The queue tables (outbox, processed events, dead letters) are read-only here: rows change
only through actions, and every action goes through a service and leaves a LogEntry with
the operator's name.
"""

from __future__ import annotations

import json
import operator
import re
import uuid
from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import DatabaseError, connection, models, transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs.ids import id_fragment_q
from jobs.json_input import BoundedJSONFormField
from jobs.models import (
    DeadLetter,
    EventSubscription,
    Notification,
    OutboxEvent,
    ProcessedEvent,
    WorkItem,
    WorkspaceDailyCost,
)
from jobs.relay import relay_wake
from jobs.services import dead_letter_discard, dead_letter_requeue

# --- shared by every console page ------------------------------------------------------------

_RUN_NUMBER_SUFFIX = re.compile(r"\s*#\d+$")

# Below this many rows an exact COUNT(*) is cheap and the estimate is too coarse.
EXACT_COUNT_BELOW = 10_000


def operator_group_name() -> str:
    return getattr(settings, "ADMIN_OPERATOR_GROUP", "operators")


def is_operator(user: Any) -> bool:
    """Staff who may run console actions: superusers and members of the operator group."""
    if not (user.is_active and user.is_staff):
        return False
    if user.is_superuser:
        return True
    # Cached on the user object: the permission checks run many times per page.
    cached = getattr(user, "_console_operator", None)
    if cached is None:
        cached = user.groups.filter(name=operator_group_name()).exists()
        user._console_operator = cached
    return bool(cached)


def table_row_estimate(model: type[Model]) -> int | None:
    """The planner's row estimate for a table, without scanning it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [model._meta.db_table],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:  # -1: never analyzed
        return None
    return int(row[0])


class EstimatedCountPaginator(Paginator):
    """A paginator that never runs COUNT(*) over a huge table.

    Unfiltered lists of large tables use pg_class.reltuples; filtered lists count
    exactly but under a short statement timeout, falling back to the estimate. Pages
    past the estimate simply come back empty, which is the price of not counting.
    """

    count_timeout_ms = 200

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        estimate = table_row_estimate(queryset.model)
        if estimate is not None and estimate >= EXACT_COUNT_BELOW:
            if not queryset.query.where:
                return estimate
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    # SET LOCAL ends with this savepoint's transaction; nothing leaks.
                    cursor.execute(f"SET LOCAL statement_timeout = {int(self.count_timeout_ms)}")
                    return queryset.count()
            except DatabaseError:
                return estimate
        return queryset.count()


# The colour of a status word wherever the console shows one: done, broken, set aside,
# waiting for someone, or on its way.
STATUS_TONES: dict[str, str] = {
    **dict.fromkeys(("completed", "processed", "published", "delivered", "sent"), "ok"),
    **dict.fromkeys(("failed", "timed_out", "rejected", "open", "dead"), "bad"),
    **dict.fromkeys(("cancelled", "discarded", "ignored", "resolved", "requeued"), "muted"),
    **dict.fromkeys(
        ("awaiting_approval", "awaiting_input", "deferred", "pending", "waiting"), "wait"
    ),
}


def status_badge(status: str) -> str:
    """A status word as a coloured badge (the console's stylesheet has the colours)."""
    return format_html(
        '<span class="console-badge console-{}">{}</span>',
        STATUS_TONES.get(str(status), "active"),
        status,
    )


class OperatorAdmin(admin.ModelAdmin):
    """Staff may look; operators may act; only superusers may edit raw rows.

    Actions declare ``permissions=["operate"]``; every action reports what it changed
    and writes a LogEntry through ``audit``.
    """

    paginator = EstimatedCountPaginator
    show_full_result_count = False

    class Media:
        css = {"all": ("console/console.css",)}

    # Configuration (workspaces, repositories, tokens, subscriptions) may be deleted by a
    # superuser; everything else is history.
    deletable = False
    # Id fields the search box also matches by a fragment of the id as the console shows
    # it (the end, ``short_id``) or as it starts; "b2fff730 #1" finds run 1 of b2fff730.
    id_search_fields: tuple[str, ...] = ()

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        fragment = _RUN_NUMBER_SUFFIX.sub("", search_term.strip())
        by_id = [q for f in self.id_search_fields if (q := id_fragment_q(f, fragment))]
        if not by_id:
            return found, may_have_duplicates
        return found | queryset.filter(reduce(operator.or_, by_id)), may_have_duplicates

    # Facet counts run one COUNT per filter choice over the whole table.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if isinstance(db_field, models.JSONField):
            kwargs.setdefault("form_class", BoundedJSONFormField)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or is_operator(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or is_operator(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # History (runs, tasks, events, dead letters, deliveries) is kept for good: no
        # one deletes it from the console; retention rules prune what may go.
        return self.deletable and request.user.is_superuser

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return is_operator(request.user)

    def audit(self, request: HttpRequest, obj: Model, message: str) -> None:
        """Record an operator action in the admin's history of the row."""
        self.log_change(request, obj, message)

    def act(
        self,
        request: HttpRequest,
        queryset: Iterable[Any],
        *,
        verb: str,
        operation: Callable[[Any], tuple[bool, str]],
    ) -> None:
        """Apply ``operation`` row by row; report changed/skipped counts to the operator.

        ``operation`` returns (changed, note); each row is audited either way, so the
        history shows refused attempts too.
        """
        changed = skipped = 0
        notes: list[str] = []
        for obj in queryset:
            done, note = operation(obj)
            self.audit(
                request,
                obj,
                f"{verb}: {'done' if done else 'skipped'}{' (' + note + ')' if note else ''}",
            )
            if done:
                changed += 1
            else:
                skipped += 1
                if note and len(notes) < 5:
                    notes.append(f"{obj}: {note}")
        if changed:
            self.message_user(request, f"{verb}: {changed} row(s) changed.", messages.SUCCESS)
        if skipped:
            detail = "; ".join(notes)
            self.message_user(
                request,
                f"{verb}: {skipped} row(s) left unchanged. {detail}".strip(),
                messages.WARNING,
            )


class ReadOnlyQueueAdmin(OperatorAdmin):
    """A queue table: nobody edits or adds rows by hand, not even a superuser."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


def pretty_json(value: Any) -> str:
    """JSON indented for reading, inside a <pre>."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str)
    return format_html('<pre class="console-json">{}</pre>', text)


def age_text(seconds: float | None) -> str:
    """A short human duration: 42s, 7m, 3h, 2d."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return (
                f"{seconds / size:.0f}{unit}"
                if seconds < size * 10
                else f"{int(seconds // size)}{unit}"
            )
    return f"{seconds:.0f}s"


def since(value: Any) -> str:
    return age_text((timezone.now() - value).total_seconds()) if value else "-"


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


# --- dead letters -----------------------------------------------------------------------------


# What a dead letter carries, as pages to open: each linker is given the letter's task
# name and one (argument name, value) it carries and answers (label, URL) or None. The
# domain apps register theirs (a run id opens the run's page); jobs knows only its own.
DeadLetterLinker = Callable[[str, str, Any], "tuple[str, str] | None"]
_dead_letter_linkers: list[DeadLetterLinker] = []


def dead_letter_linker_register(linker: DeadLetterLinker) -> None:
    _dead_letter_linkers.append(linker)


def dead_letter_carried(letter: DeadLetter) -> list[tuple[str, str]]:
    """Links to the rows the letter's job was about, in the order it carries them."""
    carried: list[tuple[str, Any]] = [(f"arg{i}", v) for i, v in enumerate(letter.args or [])]
    carried += list((letter.kwargs or {}).items())
    if letter.task_id.startswith("work:"):
        carried.append(("work_item_id", letter.task_id.removeprefix("work:")))
    links: list[tuple[str, str]] = []
    for name, value in carried:
        for linker in _dead_letter_linkers:
            found = linker(letter.task_name, name, value)
            if found is not None and found not in links:
                links.append(found)
    return links


def _own_rows_linker(task_name: str, name: str, value: Any) -> tuple[str, str] | None:
    if name == "work_item_id" and str(value).isdigit():
        url = reverse("admin:jobs_workitem_change", args=[int(value)])
        return f"work item {value}", url
    if name == "event_id" and _is_uuid(str(value)):
        event = OutboxEvent.objects.filter(event_id=value).values_list("pk", "type").first()
        if event is not None:
            return f"event {event[1]}", reverse("admin:jobs_outboxevent_change", args=[event[0]])
    return None


dead_letter_linker_register(_own_rows_linker)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyQueueAdmin):
    list_display = (
        "task_name",
        "status_col",
        "short_exception",
        "attempts",
        "recoveries",
        "queue",
        "last_failed_at",
        "resolved_by",
    )
    list_filter = ("status", "task_name", "queue")
    search_fields = ("=task_id", "task_name", "exception")
    id_search_fields = ("id",)
    ordering = ("-last_failed_at",)
    readonly_fields = (
        "id",
        "task_name",
        "task_id",
        "status",
        "queue",
        "args_pretty",
        "kwargs_pretty",
        "exception",
        "traceback_pre",
        "attempts",
        "recoveries",
        "first_failed_at",
        "last_failed_at",
        "resolved_at",
        "resolved_by",
        "workspace_id",
        "created_at",
    )
    exclude = ("args", "kwargs", "traceback")
    actions = ["requeue", "discard"]
    change_form_template = "admin/jobs/deadletter/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("traceback")

    @admin.display(description="exception")
    def short_exception(self, obj: DeadLetter) -> str:
        return format_html('<span title="{}">{}</span>', obj.exception[:500], obj.exception[:140])

    @admin.display(description="status", ordering="status")
    def status_col(self, obj: DeadLetter) -> str:
        return status_badge(obj.status)

    @admin.display(description="args")
    def args_pretty(self, obj: DeadLetter) -> str:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: DeadLetter) -> str:
        return pretty_json(obj.kwargs)

    @admin.display(description="traceback")
    def traceback_pre(self, obj: DeadLetter) -> str:
        return format_html('<pre class="console-log">{}</pre>', obj.traceback or "-")

    # --- the dead letter's own page: what it carries, and its two buttons ------------------

    LETTER_PAGE_ACTIONS: dict[str, str] = {"requeue": "requeue", "discard": "discard"}

    def get_urls(self) -> list[Any]:
        operate = self.admin_site.admin_view(require_POST(self.operate_view))
        return [
            path("<uuid:object_id>/operate/<str:action>/", operate, name="jobs_deadletter_operate"),
            *super().get_urls(),
        ]

    def operate_view(self, request: HttpRequest, object_id: Any, action: str) -> HttpResponse:
        """The page's Requeue and Discard: the list's actions, for this one letter."""
        name = self.LETTER_PAGE_ACTIONS.get(action)
        if name is None or not self.has_operate_permission(request):
            return HttpResponse("not allowed", status=403)
        get_object_or_404(DeadLetter, pk=object_id)
        getattr(self, name)(request, DeadLetter.objects.filter(pk=object_id))
        return HttpResponseRedirect(reverse("admin:jobs_deadletter_change", args=[object_id]))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        letter = DeadLetter.objects.filter(pk=object_id).first() if _is_uuid(object_id) else None
        if letter is not None:
            context["letter"] = letter
            context["carried"] = dead_letter_carried(letter)
            context["can_operate"] = self.has_operate_permission(request)
            context["title"] = f"Dead letter of {letter.task_name}"
            context["subtitle"] = None
        return super().change_view(request, object_id, form_url, extra_context=context)

    @admin.action(description="Requeue selected dead letters", permissions=["operate"])
    def requeue(self, request: HttpRequest, queryset: QuerySet) -> None:
        by = request.user.get_username()

        def operation(letter: DeadLetter) -> tuple[bool, str]:
            done = dead_letter_requeue(letter=letter, by=by)
            return done, "" if done else f"already {letter.status}"

        self.act(request, queryset, verb="Requeue", operation=operation)

    @admin.action(description="Discard selected dead letters", permissions=["operate"])
    def discard(self, request: HttpRequest, queryset: QuerySet) -> None:
        by = request.user.get_username()

        def operation(letter: DeadLetter) -> tuple[bool, str]:
            done = dead_letter_discard(letter=letter, by=by)
            return done, "" if done else f"already {letter.status}"

        self.act(request, queryset, verb="Discard", operation=operation)


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
