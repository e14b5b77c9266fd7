"""Run replay over the API: request a reproduction of a finished run, read its report."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from agentplatform.api.strict import body_refuse
from agentplatform.api.views.runs import runs_visible
from runs.models import RunReplay
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
        operation_id="runs_replay", request=None, responses={202: ReplayOutputSerializer}
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
