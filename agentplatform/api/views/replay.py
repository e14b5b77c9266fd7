"""Run replay and fork over the API: reproduce a finished run and read the report, or
start a new run from one of its model turns."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from agentplatform.api.strict import StrictInput, body_refuse
from agentplatform.api.views.runs import CommandOutputSerializer, runs_visible
from runs.models import RunReplay, Task
from runs.replay.fork import run_fork
from runs.replay.reproduce import replay_request


class ReplayOutputSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = RunReplay
        fields = [
            "id", "run", "url", "status", "requested_by", "progress", "total",
            "divergences", "report", "created_at", "finished_at",
        ]  # fmt: skip

    def get_url(self, replay: RunReplay) -> str:
        return reverse(
            "api-run-replay",
            kwargs={"pk": replay.run_id, "replay_id": replay.id},
            request=self.context.get("request"),
        )


class RunReplayCreateApi(APIView):
    """Reproduce this finished run in a fresh sandbox without calling the model; 202."""

    @extend_schema(
        operation_id="runs_replay",
        request=None,
        responses={202: ReplayOutputSerializer, 409: None},
    )
    def post(self, request: Request, pk: Any) -> Response:
        body_refuse(request)
        run = get_object_or_404(runs_visible(user=request.user), pk=pk)
        replay = replay_request(run=run, by=request.user.get_username())
        data = ReplayOutputSerializer(replay, context={"request": request}).data
        return Response(data, status=202, headers={"Location": data["url"]})


class RunReplayDetailApi(APIView):
    """One replay of this run: its progress, and its report and divergences once done."""

    @extend_schema(operation_id="runs_replay_detail", responses={200: ReplayOutputSerializer})
    def get(self, request: Request, pk: Any, replay_id: Any) -> Response:
        run = get_object_or_404(runs_visible(user=request.user), pk=pk)
        replay = get_object_or_404(RunReplay, pk=replay_id, run=run)
        return Response(ReplayOutputSerializer(replay, context={"request": request}).data)


class RunForkApi(APIView):
    """A new run (of a new dry-run task) that reuses this finished run's model turns
    1..``turn`` and asks ``model_profile`` (default: the same) from there; 202."""

    class InputSerializer(StrictInput):
        turn = serializers.IntegerField(min_value=0, help_text="Model turns to reuse.")
        model_profile = serializers.CharField(max_length=100, default="", allow_blank=True)

    @extend_schema(
        operation_id="runs_fork",
        request=InputSerializer,
        responses={202: CommandOutputSerializer, 409: None},
    )
    def post(self, request: Request, pk: Any) -> Response:
        run = get_object_or_404(runs_visible(user=request.user), pk=pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fork = run_fork(
            run=run,
            turn=serializer.validated_data["turn"],
            profile=serializer.validated_data["model_profile"],
            by=request.user.get_username(),
            source=Task.Source.API,
        )
        body = {
            "run_id": fork.id,
            "task_id": fork.task_id,
            "status": fork.status,
            "detail": f"fork of run {run.id} after turn {serializer.validated_data['turn']}",
        }
        return Response(CommandOutputSerializer(body).data, status=202)
