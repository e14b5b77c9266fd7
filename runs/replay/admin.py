"""The console's page of run replays: each reproduction's progress, report and
divergences (requested from the run list's "Replay selected runs" action)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from jobs.admin.console import OperatorAdmin, pretty_json
from runs.models import RunReplay


@admin.register(RunReplay)
class RunReplayAdmin(OperatorAdmin):
    """History: nobody adds, edits or deletes a replay; a new one is requested instead."""

    list_display = ("id", "run", "status", "progress_text", "divergence_count", "created_at")
    list_select_related = ("run",)
    list_filter = ("status",)
    ordering = ("-created_at",)
    id_search_fields = ("id", "run__id")
    fields = (
        "run",
        "status",
        "requested_by",
        "progress_text",
        "created_at",
        "finished_at",
        "divergences_json",
        "report_json",
    )
    readonly_fields = fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="progress")
    def progress_text(self, obj: RunReplay) -> str:
        return f"{obj.progress} of {obj.total}"

    @admin.display(description="divergences")
    def divergence_count(self, obj: RunReplay) -> int:
        return len(obj.divergences or [])

    @admin.display(description="divergences")
    def divergences_json(self, obj: RunReplay) -> str:
        return pretty_json(obj.divergences)

    @admin.display(description="report")
    def report_json(self, obj: RunReplay) -> str:
        return pretty_json(obj.report)
