"""``GET /api/``: where everything is."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

RESOURCES = {
    "tasks": "api-tasks",
    "runs": "api-runs",
    "workspaces": "api-workspaces",
    "repositories": "api-repositories",
    "tokens": "api-tokens",
    "dead_letters": "api-dead-letters",
    "webhook_receipts": "api-webhook-receipts",
    "outbox": "api-outbox",
    "schema": "api-schema",
    "docs": "api-docs",
}


class ApiRootApi(APIView):
    """The API's resources and documents, as absolute URLs (no authentication needed)."""

    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        tasks = serializers.URLField()
        runs = serializers.URLField()
        workspaces = serializers.URLField()
        repositories = serializers.URLField()
        tokens = serializers.URLField()
        dead_letters = serializers.URLField()
        webhook_receipts = serializers.URLField()
        outbox = serializers.URLField()
        schema = serializers.URLField()
        docs = serializers.URLField()

    @extend_schema(operation_id="api_root", responses=OutputSerializer, auth=[])
    def get(self, request: Request) -> Response:
        return Response({key: reverse(name, request=request) for key, name in RESOURCES.items()})
