"""Optional OpenTelemetry export of the platform's trace (``pip install .[otel]``).

Off unless an exporter is configured with the standard variables: ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console`` or ``none``) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` turns it off again.
The OTLP/HTTP exporter, the batch processor and the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``) read their own ``OTEL_*`` settings.

Spans follow the platform's own W3C trace (``jobs.tracing``): a span's parent is the
current ``traceparent`` and, while it is open, the span's own context becomes current,
so events, Celery headers and log lines name exported spans.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from jobs import tracing
from jobs.logs import log

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None
_configured_pid: int | None = None


def otel_wanted() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def otel_configure(*, exporter: Any = None, force: bool = False) -> bool:
    """Set up the tracer once per process (again after a fork); False when off.

    ``exporter`` replaces the one the environment names (tests use an in-memory one).
    """
    global _tracer, _provider, _configured_pid
    if exporter is None and not otel_wanted():
        return False
    with _lock:
        if _tracer is not None and _configured_pid == os.getpid() and not force:
            return True
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                BatchSpanProcessor,
                ConsoleSpanExporter,
                SimpleSpanProcessor,
            )
        except ImportError:
            log.error("otel.unavailable", hint="pip install 'agentplatform[otel]'")
            return False
        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentplatform")}
        )
        provider = TracerProvider(resource=resource)
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
            if kind == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            elif kind == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            else:
                log.error("otel.exporter_unknown", exporter=kind)
                return False
        if _provider is not None:
            with contextlib.suppress(Exception):
                _provider.shutdown()
        _provider = provider
        _tracer = provider.get_tracer("agentplatform")
        _configured_pid = os.getpid()
    return True


def otel_flush(timeout_millis: int = 5000) -> None:
    if _provider is not None:
        _provider.force_flush(timeout_millis)


def otel_shutdown() -> None:
    global _tracer, _provider, _configured_pid
    with _lock:
        if _provider is not None:
            with contextlib.suppress(Exception):
                _provider.shutdown()
        _tracer = _provider = _configured_pid = None


class _Span:
    """An open span whose context is the current traceparent until it ends."""

    def __init__(self, span: Any, previous: str | None) -> None:
        self.span = span
        self.previous = previous

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()
        if self.previous is not None:
            tracing.trace_activate(self.previous)


def span_start(
    name: str, *, kind: str = "internal", attributes: dict[str, Any] | None = None
) -> _Span | None:
    """Open a span child of the current traceparent, and make it current; None when off."""
    if _tracer is None or _configured_pid != os.getpid():
        return None
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        TraceFlags,
        set_span_in_context,
    )

    previous = tracing.traceparent_current()
    parent_context = None
    parsed = tracing.traceparent_parse(previous)
    if parsed is not None:
        trace_id, span_id, flags = parsed
        parent = SpanContext(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(flags, 16)),
        )
        parent_context = set_span_in_context(NonRecordingSpan(parent))
    span = _tracer.start_span(
        name,
        context=parent_context,
        kind=getattr(SpanKind, kind.upper()),
        attributes={k: v for k, v in (attributes or {}).items() if v is not None and v != ""},
    )
    own = span.get_span_context()
    tracing.trace_activate(f"00-{own.trace_id:032x}-{own.span_id:016x}-{int(own.trace_flags):02x}")
    return _Span(span, previous)


@contextlib.contextmanager
def span(
    name: str, *, kind: str = "internal", attributes: dict[str, Any] | None = None
) -> Iterator[None]:
    opened = span_start(name, kind=kind, attributes=attributes)
    try:
        yield
    except BaseException as exc:
        if opened is not None:
            opened.end(exc)
            opened = None
        raise
    finally:
        if opened is not None:
            opened.end()
