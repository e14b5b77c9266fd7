"""The console's run list and run page: liveness filters, operator actions, artifacts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.cache import cache
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs.admin.console import (
    OperatorAdmin,
    age_text,
    is_operator,
    pretty_json,
    since,
    status_badge,
)
from runs import services
from runs.admin.actions import _is_uuid, run_operator_action_record
from runs.admin.run_page import run_console
from runs.models import Artifact, Run
from runs.replay.reproduce import replay_request
from runs.state import ACTIVE, TERMINAL, WAITING
from runs.waiting import input_answer


class StuckFilter(admin.SimpleListFilter):
    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("stuck", "stuck (lease expired)"),
            ("stalled", "stalled (no lease, no progress)"),
            ("leased", "held by a worker"),
            ("waiting", "waiting for a person (oldest first)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        if self.value() == "stuck":
            return queryset.filter(status__in=ACTIVE, lease_until__lt=now)
        if self.value() == "stalled":
            cutoff = now - timedelta(seconds=settings.RUN_STALL_SECONDS)
            return queryset.filter(
                status__in=ACTIVE, lease_until__isnull=True, status_changed_at__lt=cutoff
            ).exclude(status__in=WAITING)
        if self.value() == "waiting":
            # Ordered oldest first by RunAdmin.get_ordering.
            return queryset.filter(status__in=WAITING)
        if self.value() == "leased":
            return queryset.filter(status__in=ACTIVE, lease_until__gte=now)
        return queryset


class FailureReasonFilter(admin.SimpleListFilter):
    title = "failure reason"
    parameter_name = "failure_reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # DISTINCT scans the table; the reason codes change rarely, so a minute of
        # caching keeps the list page cheap.
        reasons = cache.get("console:run_failure_reasons")
        if reasons is None:
            reasons = sorted(
                Run.objects.exclude(failure_reason="")
                .order_by()
                .values_list("failure_reason", flat=True)
                .distinct()[:100]
            )
            cache.set("console:run_failure_reasons", reasons, 60)
        # A reason newer than the cached list must still filter when asked for.
        if self.value() and self.value() not in reasons:
            reasons = [*reasons, self.value()]
        return [(reason, reason) for reason in reasons]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value():
            return queryset.filter(failure_reason=self.value())
        return queryset


@admin.register(Run)
class RunAdmin(OperatorAdmin):
    list_display = (
        "short_id",
        "status_col",
        "task_col",
        "age",
        "heartbeat",
        "retries_col",
        "cost",
        "failure_reason",
    )
    list_select_related = ("task__repository", "task__workspace")
    list_filter = (
        "status",
        StuckFilter,
        FailureReasonFilter,
        # Not RelatedOnlyFieldListFilter: its DISTINCT over every run is the
        # slowest query of the page; the tenant tables are small.
        "task__workspace",
        "task__repository",
    )
    search_fields = (
        "=id",
        "=task__id",
        "task__instruction",
        "task__repository__name",
        "branch",
        "failure_reason",
        "cancel_requested_by",
    )
    id_search_fields = ("id", "task__id")
    ordering = ("-created_at",)
    change_form_template = "admin/runs/run/change_form.html"
    # No bulk approval: a patch is approved on its run page, next to its diff.
    actions = ["cancel_runs", "retry_runs", "replay_runs"]
    readonly_fields = (
        "id",
        "task",
        "run_no",
        "status",
        "status_changed_at",
        "step_no",
        "lease_owner",
        "lease_until",
        "heartbeat_at",
        "attempt",
        "recoveries",
        "retries",
        "cancel_requested_at",
        "cancel_requested_by",
        "cancel_reason",
        "base_commit",
        "branch",
        "model_profile",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "failure_reason",
        "failure_detail",
        "feedback",
        "last_sequence_no",
        "created_at",
        "started_at",
        "finished_at",
        "checkpoint_pretty",
    )
    exclude = ("checkpoint",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name == "runs_run_changelist":
            # The list shows none of these; the checkpoint alone can be megabytes.
            queryset = queryset.defer(
                "checkpoint",
                "failure_detail",
                "feedback",
                "task__model_options",
                "task__usage",
                "task__pending_feedback",
                "task__budget",
                "task__source_ref",
            )
        return queryset

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Runs change only through the state machine; raw edits would bypass the fence.
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_ordering(self, request: HttpRequest) -> Any:
        if request.GET.get(StuckFilter.parameter_name) == "waiting":
            # Who has waited longest for a person comes first.
            return ("status_changed_at", "id")
        return super().get_ordering(request)

    @admin.display(description="run", ordering="created_at")
    def short_id(self, obj: Run) -> str:
        return f"{obj.short_id} #{obj.run_no}"

    @admin.display(description="status", ordering="status")
    def status_col(self, obj: Run) -> str:
        return status_badge(obj.status)

    @admin.display(description="repository · task")
    def task_col(self, obj: Run) -> str:
        url = reverse("admin:runs_task_change", args=[obj.task_id])
        return format_html(
            '<a href="{}" title="{}">{} · {}</a>',
            url,
            obj.task.instruction[:500],
            obj.task.repository.name,
            obj.task.instruction[:60],
        )

    @admin.display(description="age · in state", ordering="created_at")
    def age(self, obj: Run) -> str:
        return f"{since(obj.created_at)} · {since(obj.status_changed_at)}"

    @admin.display(description="heartbeat · lease")
    def heartbeat(self, obj: Run) -> str:
        if obj.status in TERMINAL:
            return "-"
        beat = since(obj.heartbeat_at)
        if obj.lease_until is None:
            return format_html("{} · no lease", beat)
        left = (obj.lease_until - timezone.now()).total_seconds()
        if left < 0:
            return format_html(
                '{} · <span class="console-alert">lease expired {} ago</span>',
                beat,
                age_text(-left),
            )
        return format_html("{} · lease {} left", beat, age_text(left))

    @admin.display(description="recov. / retries")
    def retries_col(self, obj: Run) -> str:
        # Not the lease generation (``attempt``): that counts every lease taken, one per
        # step, and says nothing about trouble.
        return f"{obj.recoveries} / {obj.retries}"

    @admin.display(description="cost", ordering="cost_usd")
    def cost(self, obj: Run) -> str:
        return f"${obj.cost_usd:.4f}"

    @admin.display(description="checkpoint")
    def checkpoint_pretty(self, obj: Run) -> str:
        return pretty_json(obj.checkpoint)

    # --- actions ---------------------------------------------------------------------------

    def _run_act(
        self,
        request: HttpRequest,
        queryset: Any,
        *,
        verb: str,
        action: str,
        command: Callable[[Run, str], tuple[bool, str]],
    ) -> None:
        by = request.user.get_username()

        def operation(run: Run) -> tuple[bool, str]:
            try:
                done, note = command(run, by)
            except services.CommandRefused as refused:
                done, note = False, refused.message
            run_operator_action_record(
                run=run, action=action, by=by, outcome="done" if done else "refused", note=note
            )
            return done, note

        self.act(request, queryset, verb=verb, operation=operation)

    @admin.action(description="Cancel selected runs", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        reason = request.POST.get("comment", "") or "cancelled from the admin"

        def command(run: Run, by: str) -> tuple[bool, str]:
            done = services.run_cancel_request(run=run, by=by, reason=reason)
            return done, "" if done else f"already {run.status}"

        self._run_act(
            request,
            queryset.select_related("task"),
            verb="Cancel",
            action="cancel",
            command=command,
        )

    @admin.action(description="Retry selected runs' tasks (new run)", permissions=["operate"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        def command(run: Run, by: str) -> tuple[bool, str]:
            new = services.task_retry(task=run.task, by=by)
            return True, f"started run {new.run_no}"

        self._run_act(
            request, queryset.select_related("task"), verb="Retry", action="retry", command=command
        )

    @admin.action(description="Replay selected runs (no model calls)", permissions=["operate"])
    def replay_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        def command(run: Run, by: str) -> tuple[bool, str]:
            replay = replay_request(run=run, by=by)
            return True, f"replay {replay.id} queued"

        self._run_act(
            request,
            queryset.select_related("task"),
            verb="Replay",
            action="replay",
            command=command,
        )

    def approve_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        """The run page's Approve: the diff's hash it showed is what gets approved."""
        comment = request.POST.get("comment", "")
        shown = request.POST.get("patch_sha256") or ""

        def command(run: Run, by: str) -> tuple[bool, str]:
            services.run_approve(
                run=run, by=by, comment=comment, user=request.user, patch_sha256=shown
            )
            return True, ""

        self._run_act(
            request,
            queryset.select_related("task"),
            verb="Approve",
            action="approve",
            command=command,
        )

    def reject_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        """The run page's Reject, for the diff it showed."""
        comment = request.POST.get("comment", "")
        shown = request.POST.get("patch_sha256") or ""

        def command(run: Run, by: str) -> tuple[bool, str]:
            services.run_reject(
                run=run, by=by, comment=comment, user=request.user, patch_sha256=shown
            )
            return True, ""

        self._run_act(
            request,
            queryset.select_related("task"),
            verb="Reject",
            action="reject",
            command=command,
        )

    def answer_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        """The run page's reply box: an answer to the question it showed."""
        question_id = request.POST.get("question_id") or ""
        answer = request.POST.get("answer", "")
        decision = request.POST.get("decision", "")

        def command(run: Run, by: str) -> tuple[bool, str]:
            if not _is_uuid(question_id):
                return False, "no question named"
            input_answer(
                run=run,
                question_id=question_id,
                answer=answer,
                decision=decision,
                by=by,
                user=request.user,
                via="console",
            )
            return True, ""

        self._run_act(
            request,
            queryset.select_related("task"),
            verb="Answer",
            action="answer",
            command=command,
        )

    # --- the run page ----------------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        operate = self.admin_site.admin_view(require_POST(self.operate_view))
        artifact = self.admin_site.admin_view(self.artifact_view)
        return [
            path("<uuid:object_id>/operate/<str:action>/", operate, name="runs_run_operate"),
            path(
                "<uuid:object_id>/artifacts/<uuid:artifact_id>/",
                artifact,
                name="runs_run_artifact",
            ),
            *super().get_urls(),
        ]

    RUN_PAGE_ACTIONS: dict[str, str] = {
        "cancel": "cancel_runs",
        "retry": "retry_runs",
        "approve": "approve_runs",
        "reject": "reject_runs",
        "answer": "answer_runs",
    }

    def artifact_view(self, request: HttpRequest, object_id: Any, artifact_id: Any) -> HttpResponse:
        """One artifact of the run, as plain text: its content is untrusted (model output,
        repository files), so it is never rendered as HTML."""
        if not self.has_view_permission(request):
            return HttpResponse("not allowed", status=403)
        artifact = get_object_or_404(Artifact, pk=artifact_id, run_id=object_id)
        response = HttpResponse(artifact.content, content_type="text/plain; charset=utf-8")
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response

    def operate_view(self, request: HttpRequest, object_id: Any, action: str) -> HttpResponse:
        """The run page's buttons: the same actions as the list, for one run."""
        name = self.RUN_PAGE_ACTIONS.get(action)
        if name is None or not self.has_operate_permission(request):
            return HttpResponse("not allowed", status=403)
        get_object_or_404(Run, pk=object_id)
        getattr(self, name)(request, Run.objects.filter(pk=object_id))
        return HttpResponseRedirect(reverse("admin:runs_run_change", args=[object_id]))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        run = (
            (
                Run.objects.select_related("task__repository", "task__workspace")
                .filter(pk=object_id)
                .first()
            )
            if _is_uuid(object_id)
            else None
        )
        context = dict(extra_context or {})
        if run is not None:
            context["console"] = run_console(run)
            context["can_operate"] = is_operator(request.user)
            # Headed by the run as the lists show it; its task is one link away.
            context["title"] = f"Run {run.short_id} #{run.run_no}"
            context["subtitle"] = None
        return super().change_view(request, object_id, form_url, extra_context=context)
