"""A run's questions to people: list them, answer one (docs/design.md §7)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api.strict import StrictInput
from agentplatform.api.views.runs import CommandOutputSerializer, _accepted, _run_get
from runs.models import InputRequest
from runs.waiting import MAX_ANSWER_CHARS, input_answer


class InputRequestSerializer(serializers.ModelSerializer):
    question_id = serializers.UUIDField(source="id", read_only=True)

    class Meta:
        model = InputRequest
        fields = [
            "question_id",
            "kind",
            "question",
            "choices",
            "status",
            "requested_at",
            "expires_at",
            "answered_at",
            "answered_by",
            "answered_via",
            "answer",
            "decision",
        ]
        read_only_fields = fields


class RunInputApi(APIView):
    """The run's questions (GET, oldest first); answer the pending one (POST).

    POST is refused with 409: ``input_already_answered`` for a second answer,
    ``run_ended`` once the run ended (cancelled included), ``not_awaiting_input`` when
    the run does not wait for that question; 403 when the workspace's ``approval_by``
    does not let the caller answer.
    """

    class InputSerializer(StrictInput):
        question_id = serializers.UUIDField()
        answer = serializers.CharField(
            max_length=MAX_ANSWER_CHARS,
            default="",
            allow_blank=True,
            help_text="The answer; for a plan under review with decision edit, the plan "
            "the agent is to follow.",
        )
        decision = serializers.ChoiceField(
            choices=InputRequest.Decision.choices,
            required=False,
            help_text="Plans only: accept, edit or reject (default: edit when an answer "
            "is given, else accept).",
        )

    @extend_schema(
        operation_id="runs_input_list", responses={200: InputRequestSerializer(many=True)}
    )
    def get(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        rows = InputRequest.objects.filter(run=run).order_by("requested_at")
        return Response(InputRequestSerializer(rows, many=True).data)

    @extend_schema(
        operation_id="runs_input_answer",
        request=InputSerializer,
        responses={202: CommandOutputSerializer, 403: None, 409: None},
    )
    def post(self, request: Request, pk: Any) -> Response:
        run = _run_get(request, pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        answered = input_answer(
            run=run,
            question_id=data["question_id"],
            answer=data["answer"],
            decision=data.get("decision", ""),
            by=request.user.get_username(),
            user=request.user,
            via="api",
        )
        return _accepted(run, f"question {answered.pk} answered")
