"""The product's URLs plus the baselines: a view doing exactly one INSERT per request, and
the submission endpoint's API layer over that one INSERT."""

from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response

from agentplatform.api.views.tasks import TaskCollectionApi
from agentplatform.urls import urlpatterns as product_urlpatterns

TABLE = "bench_insert"


def _insert(body: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (body) VALUES (%s)", [body[:200]])


@csrf_exempt
def one_insert(request: HttpRequest) -> HttpResponse:
    _insert(request.body.decode())
    return HttpResponse(status=202)


class SubmissionApiLayer(TaskCollectionApi):
    """``POST /api/tasks/`` up to ``task_submit``: the same authentication (the token,
    remembered after its first lookup), permission, parsing and input validation (the
    repository among the caller's workspaces, remembered alike), then the one INSERT
    instead of the submission. What the
    endpoint costs beyond it is admission and the durable records (task, run, events,
    outbox) and their wake-ups."""

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key") or ""
        serializer = self.CreateInputSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        _insert(f"{key} {serializer.validated_data['instruction']}")
        return Response({"status": "queued"}, status=202)


urlpatterns = [
    path("bench/insert/", one_insert),
    path("bench/api-layer/", SubmissionApiLayer.as_view()),
    *product_urlpatterns,
]
handler404 = "agentplatform.api.errors.page_not_found"
handler500 = "agentplatform.api.errors.server_error"
