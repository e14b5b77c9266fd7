"""The run page's live feed: the run's event stream for console staff (session auth).

The API's stream is scoped to the caller's workspaces; the console is for the
platform's staff, who see every run, so it gets the same stream behind the admin's
own rule (an active staff user).
"""

from __future__ import annotations

import uuid

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from agentplatform.api.stream import run_events_stream
from runs.models import Run


def _run_exists(run_id: uuid.UUID) -> bool:
    try:
        return Run.objects.filter(pk=run_id).exists()
    finally:
        connections.close_all()


async def console_run_stream(
    request: HttpRequest, pk: uuid.UUID
) -> HttpResponse | StreamingHttpResponse:
    user = await request.auser()
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return HttpResponse("staff only", status=403, content_type="text/plain")
    if not await sync_to_async(_run_exists)(pk):
        return HttpResponse("no such run", status=404, content_type="text/plain")
    raw = request.GET.get("last_event_id") or "0"
    after = int(raw) if raw.isdigit() else 0
    response = StreamingHttpResponse(
        run_events_stream(run_id=pk, after=after, keepalive=settings.SSE_KEEPALIVE_SECONDS),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
