from django.contrib import admin

from runs.models import Repository, Run, RunEvent, Task, Workspace


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_active_runs")


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin):
    list_display = ("name", "workspace", "provider", "default_branch")
    list_select_related = ("workspace",)


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "repository", "status", "source", "created_at")
    list_select_related = ("repository",)
    list_filter = ("status", "source")


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    can_delete = False
    readonly_fields = ("sequence_no", "type", "data", "actor", "created_at")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "task", "run_no", "status", "attempt", "recoveries", "created_at")
    list_select_related = ("task",)
    list_filter = ("status",)
    inlines = [RunEventInline]
