"""The console's live feeds for staff (session auth): a run's events, and activity.

The API's stream is scoped to the caller's workspaces; the console is for the
platform's staff, who see every run, so it gets the same stream behind the admin's
own rule (an active staff user).
"""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from agentplatform.api.stream import activity_stream, run_events_stream
from runs.models import Run


def _run_exists(run_id: uuid.UUID) -> bool:
    try:
        return Run.objects.filter(pk=run_id).exists()
    finally:
        connections.close_all()


def _staff_only() -> HttpResponse:
    return HttpResponse("staff only", status=403, content_type="text/plain")


def _event_stream_response(frames: Any) -> StreamingHttpResponse:
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def console_activity_stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """A ``changed`` frame whenever any run moved: the dashboard re-reads itself on each."""
    user = await request.auser()
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return _staff_only()
    return _event_stream_response(
        activity_stream(
            keepalive=settings.SSE_KEEPALIVE_SECONDS,
            min_interval=settings.CONSOLE_ACTIVITY_MIN_INTERVAL_SECONDS,
        )
    )


async def console_run_stream(
    request: HttpRequest, pk: uuid.UUID
) -> HttpResponse | StreamingHttpResponse:
    user = await request.auser()
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return _staff_only()
    if not await sync_to_async(_run_exists)(pk):
        return HttpResponse("no such run", status=404, content_type="text/plain")
    raw = request.GET.get("last_event_id") or "0"
    after = int(raw) if raw.isdigit() else 0
    return _event_stream_response(
        run_events_stream(run_id=pk, after=after, keepalive=settings.SSE_KEEPALIVE_SECONDS)
    )
