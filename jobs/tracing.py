"""W3C trace context: one trace from the API request or webhook to every step and consumer.

A ``traceparent`` (https://www.w3.org/TR/trace-context/) is taken from the incoming request
or created there, kept in a context variable while the request, Celery task or step runs,
stored on the task it creates, written into every event envelope, and sent as a Celery
message header. Each hop keeps the trace id and takes a new span id, so log lines, events
and (with the optional OpenTelemetry extra) exported spans of one task share one trace id.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import structlog

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_INVALID_TRACE = "0" * 32
_INVALID_SPAN = "0" * 16

_current: ContextVar[str | None] = ContextVar("traceparent", default=None)


def traceparent_parse(value: Any) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid version-00 traceparent, else None."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    trace_id, span_id, flags = match.groups()
    if trace_id == _INVALID_TRACE or span_id == _INVALID_SPAN:
        return None
    return trace_id, span_id, flags


def traceparent_new(trace_id: str | None = None, flags: str = "01") -> str:
    """A traceparent with a fresh span id (in ``trace_id`` if given, else a new trace)."""
    return f"00-{trace_id or _random_hex(128)}-{_random_hex(64)}-{flags}"


def _random_hex(bits: int) -> str:
    """A random id of ``bits`` bits, never all zeros (W3C: invalid), in lowercase hex.

    Trace and span ids only need to be unique, as OpenTelemetry's own generator makes
    them (``random.getrandbits``; the module reseeds itself in a forked child). Each
    ``secrets`` call is a ``getrandom`` system call, during which the thread gives up the
    interpreter lock; a submission made six of them.
    """
    return f"{random.getrandbits(bits) or 1:0{bits // 4}x}"


def traceparent_child(parent: Any) -> str | None:
    """The next hop of ``parent``: same trace id and flags, a new span id; None if invalid."""
    parsed = traceparent_parse(parent)
    if parsed is None:
        return None
    trace_id, _, flags = parsed
    return traceparent_new(trace_id, flags)


def trace_id_of(traceparent: Any) -> str | None:
    parsed = traceparent_parse(traceparent)
    return parsed[0] if parsed else None


def traceparent_current() -> str | None:
    """The traceparent of the request, Celery task or step this code runs for, if any."""
    return _current.get()


def traceparent_current_or_new() -> str:
    """The current trace's next hop, or the root of a new trace (a task's default)."""
    return traceparent_child(_current.get()) or traceparent_new()


def trace_activate(traceparent: Any) -> str | None:
    """Make ``traceparent`` current (and bind its trace id to log lines); None if invalid."""
    parsed = traceparent_parse(traceparent)
    if parsed is None:
        return None
    value = f"00-{parsed[0]}-{parsed[1]}-{parsed[2]}"
    _current.set(value)
    structlog.contextvars.bind_contextvars(trace_id=parsed[0], span_id=parsed[1])
    return value


def trace_clear() -> None:
    _current.set(None)
    structlog.contextvars.unbind_contextvars("trace_id", "span_id")


@contextlib.contextmanager
def trace_scope(traceparent: Any) -> Iterator[str | None]:
    """Run a block inside ``traceparent``'s trace (no change if it is invalid)."""
    token = _current.set(_current.get())
    previous = structlog.contextvars.get_contextvars()
    try:
        yield trace_activate(traceparent)
    finally:
        _current.reset(token)
        structlog.contextvars.unbind_contextvars("trace_id", "span_id")
        keep = {k: previous[k] for k in ("trace_id", "span_id") if k in previous}
        if keep:
            structlog.contextvars.bind_contextvars(**keep)


def event_traceparent(task: Any) -> str:
    """The traceparent of an event about ``task``: a child of the current trace, else of the
    trace the task was created in (a sweep run by beat continues the task's own trace)."""
    return traceparent_new(*event_trace_parent(task))


def event_trace_parent(task: Any) -> tuple[str, str]:
    """The trace id and flags ``event_traceparent`` continues for events about ``task``
    (each event takes a span id of its own: ``traceparent_new(*parent)``): the current
    trace's, else the one the task was created in, else a trace named by the task's id."""
    for candidate in (_current.get(), getattr(task, "traceparent", "")):
        parsed = traceparent_parse(candidate)
        if parsed is not None:
            return parsed[0], parsed[2]
    return task.id.hex, "01"


def event_headers(payload: Mapping[str, Any]) -> dict[str, str]:
    """Celery headers carrying an event's trace to the consumer or subscription handling it."""
    child = traceparent_child(payload.get("traceparent"))
    return {"traceparent": child} if child else {}


def event_bind(payload: Mapping[str, Any]) -> None:
    """Bind an event's ids to the log lines of whoever handles it, inside its trace."""
    fields = {
        "event_id": payload.get("id"),
        "event_type": payload.get("type"),
        "workspace_id": payload.get("workspaceid"),
        "task_id": payload.get("taskid"),
        "run_id": payload.get("runid"),
    }
    structlog.contextvars.bind_contextvars(**{k: v for k, v in fields.items() if v})
    if _current.get() is None:
        trace_activate(traceparent_child(payload.get("traceparent")))


def traceparent_header() -> dict[str, str]:
    """``{"traceparent": ...}`` of the current trace, to store or send; empty when none."""
    current = _current.get()
    return {"traceparent": current} if current else {}
