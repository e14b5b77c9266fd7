"""The operator console for tenants, tasks and runs.

Lists never query per row (related rows come with ``list_select_related``, large
columns are deferred) and never count huge tables. Operators act through actions that
call ``runs.services``; each action is recorded on the run's timeline
(``agent.run.operator_action``, with the operator as actor) and in the admin's history.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.cache import cache
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs.admin import (
    OperatorAdmin,
    age_text,
    dead_letter_linker_register,
    is_operator,
    pretty_json,
    since,
    status_badge,
)
from runs import priorities, services
from runs.admin_identities import repository_webhook_path, webhook_secret_rotate
from runs.agent.budget import budget_used
from runs.models import (
    ApiToken,
    Approval,
    Artifact,
    Membership,
    Repository,
    Run,
    RunEvent,
    Task,
    Workspace,
    WorkspaceSpend,
)
from runs.replay import admin as replay_admin  # noqa: F401  (registers its page)
from runs.replay.reproduce import replay_request
from runs.state import ACTIVE, TERMINAL, WAITING
from runs.timeline import event_record
from runs.waiting import input_answer, input_pending

OPERATOR_ACTION_EVENT = "agent.run.operator_action"
TIMELINE_LIMIT = 2000
ARTIFACT_DISPLAY_LIMIT = 200_000

S = Run.Status

# The phase a run is in while it has a status; the run page groups its timeline by it.
PHASE_OF_STATUS: dict[str, str] = {
    S.QUEUED: "setup",
    S.PREPARING: "setup",
    S.CONTEXT_LOADING: "setup",
    S.PLANNING: "planning",
    S.RUNNING: "editing",
    S.VERIFYING: "verification",
    S.JUDGING: "judging",
    S.AWAITING_APPROVAL: "approval",
    S.AWAITING_INPUT: "input",
    S.CREATING_PR: "PR",
    S.COMPLETED: "outcome",
    S.FAILED: "outcome",
    S.CANCELLED: "outcome",
    S.TIMED_OUT: "outcome",
}

# --- tenants ---------------------------------------------------------------------------------


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


# --- tasks -----------------------------------------------------------------------------------


class RunInline(admin.TabularInline):
    model = Run
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("run_no", "status", "failure_reason", "cost_usd", "created_at", "finished_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("checkpoint", "failure_detail", "feedback")


class TaskSubmitForm(forms.ModelForm):
    """What an operator may ask for: the same inputs as the API, nothing internal."""

    agent_attempts = forms.IntegerField(min_value=1, required=False, help_text="default budget")
    model_turns = forms.IntegerField(min_value=1, required=False, help_text="default budget")
    cost_usd = forms.FloatField(min_value=0, required=False, help_text="default budget")
    wall_clock_seconds = forms.IntegerField(min_value=1, required=False, help_text="default")

    BUDGET_FIELDS = ("agent_attempts", "model_turns", "cost_usd", "wall_clock_seconds")

    class Meta:
        model = Task
        fields = (
            "repository",
            "instruction",
            "task_type",
            "execution_mode",
            "risk_level",
            "target_branch",
            "priority",
            "plan_review",
        )

    def clean_priority(self) -> int:
        try:
            return priorities.parse(self.cleaned_data["priority"])
        except priorities.PriorityInvalid as exc:
            raise forms.ValidationError(str(exc)) from exc

    def budget(self) -> dict[str, float]:
        return {
            name: self.cleaned_data[name]
            for name in self.BUDGET_FIELDS
            if self.cleaned_data.get(name) is not None
        }


@admin.register(Task)
class TaskAdmin(OperatorAdmin):
    list_display = (
        "short_instruction",
        "repository",
        "workspace",
        "status_col",
        "source",
        "execution_mode",
        "priority",
        "requested_by",
        "created_at",
    )
    list_select_related = ("repository", "workspace")
    list_filter = ("status", "source", "execution_mode", "risk_level", "workspace")
    search_fields = ("=id", "instruction", "requested_by", "idempotency_key")
    id_search_fields = ("id",)
    ordering = ("-created_at",)
    inlines = [RunInline]
    actions = ["retry_tasks"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("model_options", "pending_feedback")

    # --- adding: through the submission service, like the API ----------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_operate_permission(request) or request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A task is what was asked; it changes only through commands (retry, cancel).
        return False

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):  # type: ignore[override]
        if obj is None:
            kwargs["form"] = TaskSubmitForm
            kwargs["fields"] = None
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [
                (None, {"fields": TaskSubmitForm.Meta.fields}),
                ("Budget", {"fields": TaskSubmitForm.BUDGET_FIELDS}),
            ]
        return super().get_fieldsets(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return [field.name for field in Task._meta.fields]

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        if change:
            return
        submission = services.task_submit(
            workspace=form.cleaned_data["repository"].workspace,
            repository=form.cleaned_data["repository"],
            instruction=form.cleaned_data["instruction"],
            source=Task.Source.ADMIN,
            requested_by=request.user.get_username(),
            execution_mode=form.cleaned_data["execution_mode"],
            risk_level=form.cleaned_data["risk_level"],
            task_type=form.cleaned_data["task_type"] or "change",
            target_branch=form.cleaned_data["target_branch"] or "",
            priority=form.cleaned_data["priority"],
            budget=form.budget(),
            plan_review=form.cleaned_data.get("plan_review"),
        )
        # The admin logs and redirects to ``obj``: make it the task the service created.
        obj.pk = submission.task.pk
        obj.status = submission.task.status
        self.message_user(
            request,
            f"Task {submission.task.status}"
            + (f": {submission.task.status_reason}" if submission.task.status_reason else ""),
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        if change:
            super().save_related(request, form, formsets, change)

    @admin.display(description="instruction")
    def short_instruction(self, obj: Task) -> str:
        return format_html(
            '<span title="{}">{}</span>', obj.instruction[:500], obj.instruction[:80]
        )

    @admin.display(description="status", ordering="status")
    def status_col(self, obj: Task) -> str:
        return status_badge(obj.status)

    @admin.action(description="Retry selected tasks (new run)", permissions=["operate"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet) -> None:
        by = request.user.get_username()

        def operation(task: Task) -> tuple[bool, str]:
            try:
                run = services.task_retry(task=task, by=by)
            except services.CommandRefused as refused:
                return False, refused.message
            run_operator_action_record(run=run, action="retry", by=by, outcome="done")
            return True, f"run {run.run_no}"

        self.act(request, queryset, verb="Retry", operation=operation)


# --- runs: list --------------------------------------------------------------------------------


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


def _dead_letter_run_linker(task_name: str, name: str, value: Any) -> tuple[str, str] | None:
    """A dead letter's run (a step's first argument, or a ``run_id``) or task."""
    if not _is_uuid(str(value)):
        return None
    if name == "run_id" or (task_name == "runs.step" and name == "arg0"):
        run = Run.objects.filter(pk=value).only("id", "run_no").first()
        if run is not None:
            return str(run), reverse("admin:runs_run_change", args=[run.pk])
    if name == "task_id" and Task.objects.filter(pk=value).exists():
        return f"task {value}", reverse("admin:runs_task_change", args=[value])
    return None


dead_letter_linker_register(_dead_letter_run_linker)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def run_operator_action_record(
    *, run: Run, action: str, by: str, outcome: str, note: str = ""
) -> None:
    """Put an operator's action on the run's timeline, with the operator as actor."""
    with transaction.atomic():
        event_record(
            task=run.task,
            run=run,
            type=OPERATOR_ACTION_EVENT,
            data={
                "action": action,
                "by": by,
                "outcome": outcome,
                "note": note[:500],
                "via": "admin",
            },
            actor=by,
        )


# --- the run page's content ---------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    events: list[RunEvent] = field(default_factory=list)


@dataclass
class Budget:
    name: str
    used: float
    limit: float
    unit: str = ""

    @property
    def percent(self) -> int:
        if self.limit <= 0:
            return 0
        return min(100, round(self.used / self.limit * 100))

    @property
    def tone(self) -> str:
        return "bad" if self.percent >= 90 else "warn" if self.percent >= 70 else "ok"

    @property
    def label(self) -> str:
        if self.unit == "$":
            return f"${self.used:.4f} of ${self.limit:.2f}"
        if self.unit == "s":
            return f"{age_text(self.used)} of {age_text(self.limit)}"
        return f"{self.used:g} of {self.limit:g}"


def timeline_phases(events: list[RunEvent]) -> list[Phase]:
    """Group events by the phase the run was in when each happened, in sequence order.

    A step's events are recorded before the status change that ends it, so the status
    is updated after an ``agent.run.status.changed`` event is placed.
    """
    phases: list[Phase] = []
    status = S.QUEUED
    for event in events:
        if event.type == "agent.run.status.changed":
            status = event.data.get("to", status)
        name = PHASE_OF_STATUS.get(status, status)
        if not phases or phases[-1].name != name:
            phases.append(Phase(name))
        phases[-1].events.append(event)
    return phases


def diff_lines(text: str) -> list[tuple[str, str]]:
    """Each diff line with its CSS class (add, del, hunk, file, ctx)."""
    lines = []
    for line in text.splitlines():
        if line.startswith(("+++", "---", "diff --git", "index ")):
            tone = "file"
        elif line.startswith("@@"):
            tone = "hunk"
        elif line.startswith("+"):
            tone = "add"
        elif line.startswith("-"):
            tone = "del"
        else:
            tone = "ctx"
        lines.append((tone, line))
    return lines


def _artifact_text(artifact: Artifact | None) -> str:
    if artifact is None:
        return ""
    text = artifact.content
    if len(text) > ARTIFACT_DISPLAY_LIMIT:
        return text[:ARTIFACT_DISPLAY_LIMIT] + f"\n… ({len(text)} characters, truncated)"
    return text


def finding_text(finding: Any) -> str:
    """One judge finding as a line: ``[severity] rule: message (other fields)``."""
    if not isinstance(finding, dict):
        return str(finding)
    rest = {k: v for k, v in finding.items() if k not in ("severity", "rule", "message")}
    text = f"[{finding.get('severity', 'info')}] {finding.get('rule', 'finding')}"
    if finding.get("message"):
        text += f": {finding['message']}"
    if rest:
        text += " (" + ", ".join(f"{k}={v}" for k, v in rest.items()) + ")"
    return text


def run_budgets(run: Run) -> list[Budget]:
    """Usage against each of the task's budgets: cumulative over its runs, as enforced."""
    task = run.task
    usage = task.usage or {}
    checkpoint = run.checkpoint or {}
    end = run.finished_at or timezone.now()
    wall = (
        (end - (run.started_at or run.created_at)).total_seconds()
        if run.status not in TERMINAL
        else 0.0
    )
    turns = task.runs.aggregate(n=Count("model_turns"))["n"] or 0
    return [
        Budget(
            "cost",
            float(usage.get("cost_usd", 0)) + float(run.cost_usd),
            task.budget_limit("cost_usd"),
            "$",
        ),
        Budget("model turns", float(turns), task.budget_limit("model_turns")),
        Budget(
            "agent attempts",
            budget_used(task=task, run=run, name="agent_attempts"),
            task.budget_limit("agent_attempts"),
        ),
        Budget(
            "tool failures",
            float(checkpoint.get("tool_failures", 0)),
            task.budget_limit("tool_retries"),
        ),
        Budget(
            "wall clock",
            float(usage.get("wall_clock_seconds", 0)) + wall,
            task.budget_limit("wall_clock_seconds"),
            "s",
        ),
    ]


def run_console(run: Run) -> dict[str, Any]:
    """Everything the run page shows, in a bounded number of queries."""
    events = list(run.events.order_by("sequence_no")[:TIMELINE_LIMIT])
    patches = list(run.patches.select_related("diff_artifact").order_by("attempt_no"))
    verifications = list(
        run.verifications.select_related("log_artifact", "patch").order_by("created_at")
    )
    approvals = list(run.approvals.select_related("patch__diff_artifact").order_by("requested_at"))
    pending = next((a for a in approvals if a.status == Approval.Status.PENDING), None)
    return {
        "run": run,
        "status_badge": status_badge(run.status),
        "phases": timeline_phases(events),
        "events_truncated": run.last_sequence_no > len(events),
        "tool_calls": list(run.tool_calls.order_by("step_no", "turn_no", "id")),
        "artifacts": list(
            run.artifacts.order_by("created_at").only(
                "id", "run_id", "kind", "name", "size_bytes", "created_at"
            )[:500]
        ),
        "model_turns": list(run.model_turns.order_by("step_no", "turn_no")),
        "patches": [
            {"patch": p, "lines": diff_lines(_artifact_text(p.diff_artifact))} for p in patches
        ],
        "verifications": [
            {"verification": v, "log": _artifact_text(v.log_artifact)} for v in verifications
        ],
        "judgements": [
            {"judgement": j, "findings": [finding_text(f) for f in j.findings or []]}
            for j in run.judgements.select_related("patch").order_by("created_at")
        ],
        "approvals": approvals,
        "pending_approval": (
            {"approval": pending, "lines": diff_lines(_artifact_text(pending.patch.diff_artifact))}
            if pending is not None
            else None
        ),
        "pull_requests": list(run.task.pull_requests.all()),
        "budgets": run_budgets(run),
        "totals": {"tokens_in": run.tokens_in, "tokens_out": run.tokens_out, "cost": run.cost_usd},
        "is_active": run.status in ACTIVE,
        "awaiting_approval": run.status == S.AWAITING_APPROVAL,
        "input_requests": list(run.input_requests.order_by("requested_at")),
        "pending_input": input_pending(run),
        "lease_expired": bool(
            run.lease_until and run.lease_until < timezone.now() and run.status in ACTIVE
        ),
    }
