"""Tasks: submit (idempotent), list with filters, retrieve."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from agentplatform.api.filters import StrictFilterBackend, TaskFilter
from agentplatform.api.pagination import LimitOffsetPagination
from agentplatform.api.scoping import workspace_ids_for
from agentplatform.api.selectors import repository_of_member, submission_outcome
from agentplatform.api.strict import StrictInput, ThreadFieldsInput
from runs import fairness, priorities
from runs.identities import idempotency_key_reserved
from runs.models import Repository, Task, Workspace
from runs.services import IdempotencyKeyReserved, Submission, task_submit


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "enum": sorted(priorities.CLASSES.values())},
            {"type": "string", "enum": list(priorities.CLASSES)},
        ]
    }
)
class PriorityField(serializers.Field):
    """A priority class by number or name; the number."""

    def to_internal_value(self, data: Any) -> int:
        try:
            return priorities.parse(data)
        except priorities.PriorityInvalid as exc:
            raise ValidationError(str(exc)) from exc

    def to_representation(self, value: int) -> int:
        return value


class TaskOutputSerializer(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    repository: serializers.PrimaryKeyRelatedField[Repository] = serializers.PrimaryKeyRelatedField(
        read_only=True
    )

    class Meta:
        model = Task
        fields = [
            "id",
            "workspace",
            "repository",
            "instruction",
            "task_type",
            "risk_level",
            "execution_mode",
            "target_branch",
            "requested_by",
            "source",
            "priority",
            "budget",
            "plan_review",
            "status",
            "status_reason",
            "usage",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


def _tasks_visible(request: Request) -> QuerySet[Task]:
    return (
        Task.objects.filter(workspace_id__in=workspace_ids_for(user=request.user))
        .select_related("workspace")
        .order_by("-created_at", "id")
    )


class TaskBudgetInputSerializer(StrictInput):
    """Budget overrides of one task; a key left out keeps the platform's default."""

    agent_attempts = serializers.FloatField(min_value=0, required=False)
    model_turns = serializers.FloatField(min_value=0, required=False)
    tool_retries = serializers.FloatField(min_value=0, required=False)
    wall_clock_seconds = serializers.FloatField(min_value=0, required=False)
    cost_usd = serializers.FloatField(min_value=0, required=False)


class CallerRepositoryField(serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A repository id among the caller's workspaces, read by one fixed statement.

    Validates and answers as ``PrimaryKeyRelatedField`` over the caller's repositories
    does (the same messages for a wrong type and for an id that is not theirs).
    """

    def to_internal_value(self, data: Any) -> Repository:
        try:
            if isinstance(data, bool):
                raise TypeError
            repository_id = Repository._meta.pk.get_prep_value(data)
        except (TypeError, ValueError):
            self.fail("incorrect_type", data_type=type(data).__name__)
        request = self.context["request"]
        repository = repository_of_member(user=request.user, repository_id=repository_id)
        if repository is None:
            self.fail("does_not_exist", pk_value=data)
        return repository


class TaskCollectionApi(generics.ListAPIView):
    """List the caller's tasks (GET) or submit a new one (POST)."""

    class CreateInputSerializer(ThreadFieldsInput):
        repository = CallerRepositoryField(
            queryset=Repository.objects.none(),
            help_text="Repository id; it decides the workspace of the task.",
        )
        instruction = serializers.CharField(max_length=20000, trim_whitespace=True)
        task_type = serializers.CharField(max_length=64, default="change")
        risk_level = serializers.ChoiceField(choices=Task.Risk.choices, default=Task.Risk.LOW)
        execution_mode = serializers.ChoiceField(
            choices=Task.Mode.choices, default=Task.Mode.AUTONOMOUS_PR
        )
        target_branch = serializers.CharField(max_length=200, default="", allow_blank=True)
        priority = PriorityField(
            required=False,
            help_text="A class by name or number: emergency 0, security 10, interactive 50,"
            " normal 100, batch 200, maintenance 500 (lower is more urgent). Default: the"
            " repository's default_priority.",
        )
        budget = TaskBudgetInputSerializer(
            required=False, help_text="Overrides of the default budget; any key may be left out."
        )
        model_options = serializers.DictField(
            default=dict, help_text="Per-task model options (e.g. the scripted transcript)."
        )
        plan_review = serializers.BooleanField(
            required=False,
            allow_null=True,
            default=None,
            help_text="Pause after planning until a person accepts, edits or rejects the "
            "plan (POST /api/runs/<id>/input/); null or absent: the repository's setting.",
        )

    class CreateOutputSerializer(serializers.Serializer):
        task_id = serializers.UUIDField()
        run_id = serializers.UUIDField(allow_null=True)
        status = serializers.ChoiceField(
            choices=[Task.Status.QUEUED, Task.Status.DEFERRED],
            help_text="queued: a run was created; deferred: admission control held it back.",
        )
        reason = serializers.CharField(allow_null=True, help_text="Why it was deferred.")

    serializer_class = TaskOutputSerializer
    pagination_class = LimitOffsetPagination
    filter_backends = [StrictFilterBackend]
    filterset_class = TaskFilter

    def get_queryset(self) -> QuerySet[Task]:
        # Ordered like the task_created index, which serves the page without a sort.
        return _tasks_visible(self.request)

    @extend_schema(
        operation_id="tasks_create",
        request=CreateInputSerializer,
        responses={202: CreateOutputSerializer, 422: None},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^\S(.*\S)?$"},
                OpenApiParameter.HEADER,
                description="Repeat a submission safely: the same key with the same body "
                "returns the original response; with a different body, 422. Keys starting "
                "with github: or gitlab: are reserved for tasks made from provider events "
                "(400 idempotency_key_reserved).",
            )
        ],
    )
    def post(self, request: Request) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key.strip()) <= 200:
            raise ValidationError({"Idempotency-Key": ["must be 1 to 200 characters"]})
        if idempotency_key_reserved(key):
            # Before anything else is read: the namespace belongs to provider events.
            raise IdempotencyKeyReserved()
        serializer = self.CreateInputSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        repository: Repository = data["repository"]
        submission: Submission = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction=data["instruction"],
            source=Task.Source.API,
            requested_by=request.user.get_username(),
            idempotency_key=key.strip() if key else None,
            execution_mode=data["execution_mode"],
            risk_level=data["risk_level"],
            task_type=data["task_type"],
            target_branch=data["target_branch"],
            priority=data.get("priority"),
            budget=dict(data.get("budget") or {}),
            model_options=data["model_options"],
            plan_review=data.get("plan_review"),
        )
        # Already in the output serializer's form (ids, a status, a reason or null): the
        # renderer writes it as that serializer would, without building its fields.
        body = submission_outcome(submission=submission)
        return Response(
            body,
            status=202,
            headers={"Location": f"/api/tasks/{submission.task.id}/"},
        )


class TaskDetailSerializer(TaskOutputSerializer):
    effective_priority = serializers.SerializerMethodField(
        help_text="The priority class less one per 30 minutes waited (lower is more urgent)."
    )
    queue_position = serializers.SerializerMethodField(
        help_text="A deferred task's place in its workspace's re-admission order (1: next)."
    )

    class Meta(TaskOutputSerializer.Meta):
        fields = [*TaskOutputSerializer.Meta.fields, "effective_priority", "queue_position"]
        read_only_fields = fields

    def get_effective_priority(self, task: Task) -> int:
        return priorities.effective(task.priority, task.created_at)

    def get_queue_position(self, task: Task) -> int | None:
        return fairness.queue_position(task)


class TaskDetailApi(generics.RetrieveAPIView):
    """One task of the caller's workspaces."""

    serializer_class = TaskDetailSerializer
    lookup_field = "pk"

    def get_queryset(self) -> QuerySet[Task]:
        return _tasks_visible(self.request)
