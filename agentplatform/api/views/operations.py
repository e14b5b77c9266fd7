"""Operations: dead letters, webhook receipts (read-only) and the outbox's health."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api.errors import ProblemError
from agentplatform.api.filters import DeadLetterFilter, StrictFilterBackend, WebhookReceiptFilter
from agentplatform.api.pagination import LimitOffsetPagination
from agentplatform.api.scoping import is_admin_of, request_user, workspace_ids_for
from agentplatform.api.strict import body_refuse
from jobs.models import DeadLetter, OutboxEvent
from jobs.relay import outbox_lag_seconds
from jobs.services import dead_letter_discard, dead_letter_requeue
from runs.models import Membership, Repository
from webhooks.models import WebhookReceipt

# --- dead letters ------------------------------------------------------------------------------


def _dead_letters_visible(request: Request) -> QuerySet[DeadLetter]:
    # Letters of jobs that belong to no workspace (relay, webhook intake) are the
    # platform's own: only staff see them.
    scope = Q(workspace_id__in=workspace_ids_for(user=request.user))
    if request.user.is_staff:
        scope |= Q(workspace_id__isnull=True)
    return DeadLetter.objects.filter(scope).order_by("-last_failed_at", "id")


class DeadLetterOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeadLetter
        fields = [
            "id",
            "task_name",
            "task_id",
            "args",
            "kwargs",
            "queue",
            "exception",
            "attempts",
            "recoveries",
            "first_failed_at",
            "last_failed_at",
            "status",
            "resolved_at",
            "resolved_by",
            "workspace_id",
        ]
        read_only_fields = fields


class DeadLetterListApi(generics.ListAPIView):
    """Jobs that exhausted their retries, newest failure first."""

    serializer_class = DeadLetterOutputSerializer
    pagination_class = LimitOffsetPagination
    filter_backends = [StrictFilterBackend]
    filterset_class = DeadLetterFilter

    def get_queryset(self) -> QuerySet[DeadLetter]:
        return _dead_letters_visible(self.request)


class DeadLetterDetailApi(APIView):
    """One dead letter, with its traceback."""

    class OutputSerializer(DeadLetterOutputSerializer):
        class Meta(DeadLetterOutputSerializer.Meta):
            fields = [*DeadLetterOutputSerializer.Meta.fields, "traceback"]
            read_only_fields = fields

    @extend_schema(operation_id="dead_letters_retrieve", responses=OutputSerializer)
    def get(self, request: Request, pk: Any) -> Response:
        letter = get_object_or_404(_dead_letters_visible(request), pk=pk)
        return Response(self.OutputSerializer(letter).data)


def _letter_for_resolution(request: Request, pk: Any) -> DeadLetter:
    letter = get_object_or_404(_dead_letters_visible(request), pk=pk)
    if not request.user.is_staff and not (
        letter.workspace_id is not None
        and is_admin_of(user=request.user, workspace_id=letter.workspace_id)
    ):
        raise PermissionDenied("only workspace admins resolve dead letters")
    return letter


def _not_open(letter: DeadLetter) -> ProblemError:
    letter.refresh_from_db(fields=["status"])
    return ProblemError(
        status_code=409, code="dead_letter_not_open", detail=f"dead letter is {letter.status}"
    )


class DeadLetterRequeueApi(APIView):
    """Send the job again with its original arguments (admins); 409 unless open."""

    @extend_schema(
        operation_id="dead_letters_requeue",
        request=None,
        responses={202: DeadLetterOutputSerializer, 409: None},
    )
    def post(self, request: Request, pk: Any) -> Response:
        body_refuse(request)
        letter = _letter_for_resolution(request, pk)
        if not dead_letter_requeue(letter=letter, by=request.user.get_username()):
            raise _not_open(letter)
        letter.refresh_from_db()
        return Response(DeadLetterOutputSerializer(letter).data, status=202)


class DeadLetterDiscardApi(APIView):
    """Give up on the job for good (admins); 409 unless open."""

    @extend_schema(
        operation_id="dead_letters_discard",
        request=None,
        responses={200: DeadLetterOutputSerializer, 409: None},
    )
    def post(self, request: Request, pk: Any) -> Response:
        body_refuse(request)
        letter = _letter_for_resolution(request, pk)
        if not dead_letter_discard(letter=letter, by=request.user.get_username()):
            raise _not_open(letter)
        letter.refresh_from_db()
        return Response(DeadLetterOutputSerializer(letter).data)


# --- webhook receipts --------------------------------------------------------------------------


def _receipts_visible(request: Request) -> QuerySet[WebhookReceipt]:
    """Receipts routed to the caller's repositories; staff see every receipt.

    A receipt belongs to the repositories whose own webhook secret verified it (its
    ``repository_ids``), not to whoever claims the repository its payload names: a
    workspace that registers another's ``external_id`` sees none of its deliveries. A
    delivery routed to no repository is visible to staff only.
    """
    receipts = WebhookReceipt.objects.order_by("-received_at", "id")
    if request.user.is_staff:
        return receipts
    repository_ids = list(
        Repository.objects.filter(
            workspace_id__in=workspace_ids_for(user=request.user)
        ).values_list("pk", flat=True)
    )
    if not repository_ids:
        return receipts.none()
    routed = Q()
    for repository_id in repository_ids:
        routed |= Q(repository_ids__contains=[repository_id])
    return receipts.filter(routed)


class WebhookReceiptOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookReceipt
        fields = [
            "id",
            "provider",
            "delivery_id",
            "hook_id",
            "event",
            "action",
            "status",
            "status_reason",
            "error",
            "attempts",
            "received_at",
            "processed_at",
        ]
        read_only_fields = fields


class WebhookReceiptListApi(generics.ListAPIView):
    """Webhook deliveries as received, newest first (read-only)."""

    serializer_class = WebhookReceiptOutputSerializer
    pagination_class = LimitOffsetPagination
    filter_backends = [StrictFilterBackend]
    filterset_class = WebhookReceiptFilter

    def get_queryset(self) -> QuerySet[WebhookReceipt]:
        return _receipts_visible(self.request)


class WebhookReceiptDetailApi(APIView):
    """One delivery with its payload (headers are not exposed: they carry signatures)."""

    class OutputSerializer(WebhookReceiptOutputSerializer):
        class Meta(WebhookReceiptOutputSerializer.Meta):
            fields = [*WebhookReceiptOutputSerializer.Meta.fields, "payload"]
            read_only_fields = fields

    @extend_schema(operation_id="webhook_receipts_retrieve", responses=OutputSerializer)
    def get(self, request: Request, pk: int) -> Response:
        receipt = get_object_or_404(_receipts_visible(request), pk=pk)
        return Response(self.OutputSerializer(receipt).data)


# --- outbox ------------------------------------------------------------------------------------


class OutboxStatusApi(APIView):
    """How far the outbox relay is behind (staff and workspace admins).

    The figures are platform-wide, not per workspace, so members who administer
    nothing do not see them.
    """

    class OutputSerializer(serializers.Serializer):
        pending = serializers.IntegerField(help_text="Events not yet published.")
        failing = serializers.IntegerField(help_text="Pending events that failed at least once.")
        lag_seconds = serializers.FloatField(help_text="Age of the oldest pending event.")
        oldest_pending_at = serializers.DateTimeField(allow_null=True)

    @extend_schema(operation_id="outbox_status", responses=OutputSerializer)
    def get(self, request: Request) -> Response:
        if (
            not request.user.is_staff
            and not Membership.objects.filter(
                user=request_user(request), role=Membership.Role.ADMIN
            ).exists()
        ):
            raise PermissionDenied("only staff and workspace admins see the outbox")
        pending = OutboxEvent.objects.filter(published_at__isnull=True)
        body = {
            "pending": pending.count(),
            "failing": pending.filter(attempts__gt=0).count(),
            "lag_seconds": outbox_lag_seconds(),
            "oldest_pending_at": pending.order_by("id")
            .values_list("created_at", flat=True)
            .first(),
        }
        return Response(self.OutputSerializer(body).data)
