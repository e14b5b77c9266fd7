"""The dead-letter queue: what each letter carries as links (each app registers its
linkers), and the actions that replay or discard letters."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs.admin.console import ReadOnlyQueueAdmin, pretty_json, status_badge
from jobs.models import DeadLetter, OutboxEvent
from jobs.services import dead_letter_discard, dead_letter_requeue

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
