"""Per-request context: a request id and a W3C trace, bound to every log line; one access line.

The request id comes from a sane ``X-Request-ID`` header or is made here, and is echoed
back. The trace continues an incoming ``traceparent`` or starts one; tasks and events
created by the request belong to it. Each response is logged once: 5xx at error, the
rest at info (a client's mistake is not the server's warning).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from agentplatform import metrics, otel
from jobs import tracing

log = structlog.get_logger("agentplatform.http")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Probes and scrapes would drown the log at info.
_QUIET_PATHS = ("/healthz", "/readyz", "/metrics")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATIC = "/static/"


class RequestContextMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        otel.otel_configure()
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self._acall(request)
        started = self._begin(request)
        try:
            response = self.get_response(request)
            self._end(request, response, started)
            return response
        finally:
            self._clear(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        started = self._begin(request)
        try:
            get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
            response = await get_response(request)
            self._end(request, response, started)
            return response
        finally:
            self._clear(request)

    def _begin(self, request: HttpRequest) -> float:
        given = request.headers.get("X-Request-ID", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        incoming = request.headers.get("traceparent")
        # With OpenTelemetry on, the server span is the caller's child and our hop;
        # without it, a new span id stands for this request.
        if tracing.trace_activate(incoming) is None:
            tracing.trace_clear()
        request._otel_span = otel.span_start(  # type: ignore[attr-defined]
            request.method or "HTTP",
            kind="server",
            attributes={"http.request.method": request.method, "url.path": request.path},
        )
        if request._otel_span is None:  # type: ignore[attr-defined]
            tracing.trace_activate(tracing.traceparent_child(incoming) or tracing.traceparent_new())
        return time.monotonic()

    def _end(self, request: HttpRequest, response: HttpResponseBase, started: float) -> None:
        response["X-Request-ID"] = request.request_id  # type: ignore[attr-defined]
        status = response.status_code
        match = getattr(request, "resolver_match", None)
        route = getattr(match, "route", "") if match is not None else ""
        elapsed = time.monotonic() - started
        # The route pattern, never the path: one series per URL pattern, not per run id.
        route_label = route or ("static" if request.path.startswith(_STATIC) else "unmatched")
        method = request.method if request.method in _METHODS else "other"
        metrics.http_requests.labels(method, route_label, f"{status // 100}xx").inc()
        metrics.http_request_seconds.labels(method, route_label).observe(elapsed)
        opened = getattr(request, "_otel_span", None)
        if opened is not None:
            opened.span.update_name(f"{request.method} {route or request.path}")
            opened.span.set_attribute("http.response.status_code", status)
            if status >= 500:
                from opentelemetry.trace import Status, StatusCode

                opened.span.set_status(Status(StatusCode.ERROR))
        fields = {
            "method": request.method,
            "path": request.path,
            "status": status,
            "duration_ms": round(elapsed * 1000, 1),
        }
        if status >= 500:
            log.error("http.response", **fields)
        elif request.path in _QUIET_PATHS:
            log.debug("http.response", **fields)
        else:
            log.info("http.response", **fields)

    def _clear(self, request: HttpRequest) -> None:
        opened = getattr(request, "_otel_span", None)
        if opened is not None:
            request._otel_span = None  # type: ignore[attr-defined]
            opened.end()
        tracing.trace_clear()
        structlog.contextvars.clear_contextvars()
