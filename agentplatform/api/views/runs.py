"""Runs: list, detail (budget and current step), timeline, artifacts, and commands."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api.errors import ProblemError
from agentplatform.api.filters import RunFilter, StrictFilterBackend
from agentplatform.api.pagination import LimitOffsetPagination, SequenceCursorPagination
from agentplatform.api.scoping import workspace_ids_for
from agentplatform.api.selectors import (
    run_budget_usage,
    run_current_step,
    run_visible,
)
from agentplatform.api.strict import StrictInput, body_refuse
from runs.models import Artifact, Run, RunEvent, Task, Workspace
from runs.services import run_approve, run_cancel_request, run_reject, task_retry


def runs_visible(*, user: Any) -> QuerySet[Run]:
    return (
        Run.objects.filter(workspace_id__in=workspace_ids_for(user=user))
        .select_related("task", "task__workspace")
        .order_by("-created_at", "id")
    )


def _run_get(request: Request, run_id: Any) -> Run:
    return get_object_or_404(runs_visible(user=request.user), pk=run_id)


class RunOutputSerializer(serializers.ModelSerializer):
    task: serializers.PrimaryKeyRelatedField[Task] = serializers.PrimaryKeyRelatedField(
        read_only=True
    )
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    lease_generation = serializers.IntegerField(
        source="attempt",
        read_only=True,
        help_text="How many times a worker took the run's lease (the fencing token); "
        "not a count of agent attempts.",
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "task",
            "workspace",
            "run_no",
            "status",
            "status_changed_at",
            "step_no",
            "lease_generation",
            "recoveries",
            "retries",
            "branch",
            "base_commit",
            "model_profile",
            "tokens_in",
            "tokens_out",
            "cost_usd",
            "failure_reason",
            "cancel_requested_at",
            "last_sequence_no",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class RunListApi(generics.ListAPIView):
    """Runs of the caller's workspaces, newest first."""

    serializer_class = RunOutputSerializer
    pagination_class = LimitOffsetPagination
    filter_backends = [StrictFilterBackend]
    filterset_class = RunFilter

    def get_queryset(self) -> QuerySet[Run]:
        # Ordered like the run_ws_created index (one workspace) and the run_created
        # index (several), which serve the page without a sort.
        return (
            Run.objects.filter(workspace_id__in=workspace_ids_for(user=self.request.user))
            .select_related("workspace")
            .order_by("-created_at", "id")
        )


class RunDetailApi(APIView):
    """One run, with its budget usage and its current step."""

    class OutputSerializer(RunOutputSerializer):
        class BudgetLineSerializer(serializers.Serializer):
            used = serializers.FloatField()
            limit = serializers.FloatField()

        class CurrentStepSerializer(serializers.Serializer):
            step_no = serializers.IntegerField()
            status = serializers.ChoiceField(choices=Run.Status.choices)
            status_changed_at = serializers.DateTimeField()
            lease_owner = serializers.CharField(allow_null=True)
            lease_until = serializers.DateTimeField(allow_null=True)
            heartbeat_at = serializers.DateTimeField(allow_null=True)
            lease_generation = serializers.IntegerField()
            agent_attempts = serializers.IntegerField(
                help_text="Patches the agent produced in this run (its first try and each "
                "retry with feedback). Setup failures such as a failed clone are none."
            )
            recoveries = serializers.IntegerField()
            retries = serializers.IntegerField()
            cancel_requested_at = serializers.DateTimeField(allow_null=True)

        failure_detail = serializers.CharField(read_only=True)
        budget = serializers.DictField(child=BudgetLineSerializer(), read_only=True)
        current_step = CurrentStepSerializer(read_only=True)
        submitted_by = serializers.CharField(
            read_only=True,
            help_text='Who submitted the latest patch: "model" (it called finish), '
            '"budget" (turns, cost or time ran out) or "loop" (a loop was stopped); '
            '"" before any patch.',
        )

        class Meta(RunOutputSerializer.Meta):
            fields = [
                *RunOutputSerializer.Meta.fields,
                "failure_detail",
                "budget",
                "current_step",
                "submitted_by",
            ]
            read_only_fields = fields

    @extend_schema(operation_id="runs_retrieve", responses=OutputSerializer)
    def get(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        # Computed, not model fields: plain instance attributes the OutputSerializer reads.
        run.__dict__["budget"] = run_budget_usage(run=run)
        run.__dict__["current_step"] = run_current_step(run=run)
        latest = run.patches.order_by("-attempt_no").values_list("submitted_by", flat=True)[:1]
        run.__dict__["submitted_by"] = (latest[0] or "model") if latest else ""
        return Response(self.OutputSerializer(run).data)


class RunEventListApi(APIView):
    """The run's timeline in sequence order, paginated by a sequence cursor."""

    class OutputSerializer(serializers.ModelSerializer):
        sequence = serializers.IntegerField(source="sequence_no")

        class Meta:
            model = RunEvent
            fields = ["id", "sequence", "type", "data", "actor", "created_at"]
            read_only_fields = fields

    @extend_schema(
        operation_id="runs_events_list",
        parameters=[
            OpenApiParameter(
                "after",
                OpenApiTypes.INT,
                description="Return events with a sequence number greater than this (the cursor).",
                required=False,
            ),
            OpenApiParameter(
                "limit",
                OpenApiTypes.INT,
                required=False,
                description="Page size, 1 to 500 (default 100).",
            ),
        ],
        responses=inline_serializer(
            "RunEventPage",
            fields={
                "next": serializers.URLField(allow_null=True),
                "last_sequence": serializers.IntegerField(),
                "results": OutputSerializer(many=True),
            },
        ),
    )
    def get(self, request: Request, pk: Any) -> Response:
        # Is the run the caller's (404 before any parameter is read), then the page.
        if not run_visible(user=request.user, run_id=pk):
            raise Http404("No Run matches the given query.")
        paginator = SequenceCursorPagination()
        paginator.parse(request)
        events = RunEvent.objects.filter(run_id=pk, sequence_no__gt=paginator.after)
        page = paginator.page_of(list(events.order_by("sequence_no")[: paginator.limit + 1]))
        return paginator.response(self.OutputSerializer(page, many=True).data)


class ArtifactOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["id", "kind", "name", "content_type", "size_bytes", "sha256", "created_at"]
        read_only_fields = fields


class RunArtifactListApi(generics.ListAPIView):
    """The run's artifacts (metadata; fetch one for its content)."""

    serializer_class = ArtifactOutputSerializer
    pagination_class = LimitOffsetPagination

    def get_queryset(self) -> QuerySet[Artifact]:
        run = _run_get(self.request, self.kwargs["pk"])
        return Artifact.objects.filter(run=run).order_by("created_at", "id")


class RunArtifactDetailApi(APIView):
    """One artifact with its content."""

    class OutputSerializer(ArtifactOutputSerializer):
        class Meta(ArtifactOutputSerializer.Meta):
            fields = [*ArtifactOutputSerializer.Meta.fields, "content"]
            read_only_fields = fields

    @extend_schema(operation_id="runs_artifacts_retrieve", responses=OutputSerializer)
    def get(self, request: Request, pk: Any, artifact_id: Any) -> Response:
        run = _run_get(request, pk)
        artifact = get_object_or_404(Artifact, run=run, pk=artifact_id)
        return Response(self.OutputSerializer(artifact).data)


class CommandOutputSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    status = serializers.CharField(help_text="The run's status when the command was accepted.")
    detail = serializers.CharField()


def _accepted(run: Run, detail: str) -> Response:
    body = {"run_id": run.id, "task_id": run.task_id, "status": run.status, "detail": detail}
    return Response(CommandOutputSerializer(body).data, status=202)


_COMMAND_ERRORS = {409: None}


class RunCancelApi(APIView):
    """Request cancellation; the run stops at its next check. 409 if it already ended."""

    class InputSerializer(StrictInput):
        reason = serializers.CharField(max_length=500, default="", allow_blank=True)

    @extend_schema(
        operation_id="runs_cancel",
        request=InputSerializer,
        responses={202: CommandOutputSerializer, **_COMMAND_ERRORS},
    )
    def post(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not run_cancel_request(
            run=run, by=request.user.get_username(), reason=serializer.validated_data["reason"]
        ):
            raise ProblemError(
                status_code=409, code="run_terminal", detail=f"run already ended ({run.status})"
            )
        return _accepted(run, "cancellation requested")


class ApprovalInputSerializer(StrictInput):
    comment = serializers.CharField(max_length=5000, default="", allow_blank=True)
    patch_sha256 = serializers.RegexField(
        r"^[0-9a-f]{64}$",
        required=False,
        help_text="The SHA-256 of the diff you looked at; if the pending patch is another "
        "one, the decision is refused (409 approval_stale).",
    )


class RunApproveApi(APIView):
    """Approve the pending patch; 409 unless the run awaits approval."""

    class InputSerializer(ApprovalInputSerializer):
        pass

    @extend_schema(
        operation_id="runs_approve",
        request=InputSerializer,
        responses={202: CommandOutputSerializer, **_COMMAND_ERRORS},
    )
    def post(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        approval = run_approve(
            run=run,
            by=request.user.get_username(),
            comment=serializer.validated_data["comment"],
            user=request.user,
            patch_sha256=serializer.validated_data.get("patch_sha256"),
        )
        return _accepted(run, f"approval {approval.status}")


class RunRejectApi(APIView):
    """Reject the pending patch; the run ends failed. 409 unless it awaits approval."""

    class InputSerializer(ApprovalInputSerializer):
        pass

    @extend_schema(
        operation_id="runs_reject",
        request=InputSerializer,
        responses={202: CommandOutputSerializer, **_COMMAND_ERRORS},
    )
    def post(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run_reject(
            run=run,
            by=request.user.get_username(),
            comment=serializer.validated_data["comment"],
            user=request.user,
            patch_sha256=serializer.validated_data.get("patch_sha256"),
        )
        return _accepted(run, "approval rejected")


class RunRetryApi(APIView):
    """Start a new run of this run's task from scratch; 409 while a run is active."""

    @extend_schema(
        operation_id="runs_retry",
        request=None,
        responses={202: CommandOutputSerializer, **_COMMAND_ERRORS},
    )
    def post(self, request: Request, pk: Any) -> Response:
        body_refuse(request)
        run = _run_get(request, pk)
        new_run = task_retry(task=run.task, by=request.user.get_username())
        return _accepted(new_run, f"run {new_run.run_no} queued")
