"""The console's task list and the form that submits a task, like the API does."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from jobs.admin.console import OperatorAdmin, status_badge
from runs import priorities, services
from runs.admin.actions import run_operator_action_record
from runs.models import Run, Task


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
