"""The step engine's hooks into logs, traces and metrics (kept here, out of the engine)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import structlog

from agentplatform import metrics, otel
from agentplatform.logging import secrets_register
from jobs import tracing

__all__ = ["step_bind", "step_timed"]

_SECRET_OPTION_WORDS = ("key", "token", "secret", "password")


def _secrets_of(run: Any) -> list[str]:
    """Values of this run's settings that must never reach a log line."""
    task = run.task
    repository = task.repository
    found = [getattr(repository, "webhook_secret", "")]
    parts = urlsplit(getattr(repository, "clone_url", "") or "")
    found += [parts.username or "", parts.password or ""]
    for name, value in (task.model_options or {}).items():
        if isinstance(value, str) and any(word in name.lower() for word in _SECRET_OPTION_WORDS):
            found.append(value)
    return [value for value in found if value]


def step_bind(run: Any, step_no: int) -> None:
    """Bind the run's ids to every log line of the step and continue its task's trace."""
    task = run.task
    structlog.contextvars.bind_contextvars(
        run_id=str(run.id),
        task_id=str(task.id),
        workspace_id=task.workspace_id,
        step_no=step_no,
        step=run.status,
    )
    # A step belongs to its task's trace whoever woke it (a retry, the reaper, a webhook);
    # a message that already carries that trace keeps its span as the parent.
    current = tracing.traceparent_current()
    task_trace = tracing.trace_id_of(getattr(task, "traceparent", ""))
    if current is None or tracing.trace_id_of(current) != (task_trace or task.id.hex):
        tracing.trace_activate(
            tracing.traceparent_child(getattr(task, "traceparent", ""))
            or tracing.traceparent_child(current)
            or tracing.traceparent_new(task.id.hex)
        )
    secrets_register(_secrets_of(run))


@contextmanager
def step_timed(step: str) -> Iterator[None]:
    """Time the step's work (a histogram) and, with OpenTelemetry on, export it as a span."""
    context = structlog.contextvars.get_contextvars()
    with (
        metrics.step_timed(step),
        otel.span(
            f"step {step}",
            attributes={
                "agentplatform.run_id": context.get("run_id"),
                "agentplatform.task_id": context.get("task_id"),
                "agentplatform.step_no": context.get("step_no"),
            },
        ),
    ):
        yield
