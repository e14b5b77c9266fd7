"""What every console page shares: the operator permission, the base admin classes, a
paginator that does not count huge tables, and how states, ages and JSON are shown."""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import DatabaseError, connection, models, transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from jobs.ids import id_fragment_q
from jobs.json_input import BoundedJSONFormField

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
