"""The Celery application: configured from Django settings (namespace CELERY_)."""

import os
import time
from typing import Any

from celery import Celery, signals

from agentplatform import broker  # noqa: F401  (registers the Redis transport)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")


app = Celery("agentplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def result_backend_load() -> None:
    """Load the result backend now, at a web process's start: its first load scans the
    entry points of every installed distribution (20 ms on an idle machine, several
    times that under load), which would otherwise fall on the first request that sends
    a task."""
    app.backend  # noqa: B018  (the property loads and keeps it)


# Spans of the Celery tasks running in this process, ended by task_postrun.
_open_spans: dict[str, Any] = {}

# What a task's positional arguments name, bound to its log lines (see _task_started).
_TASK_ARG_CONTEXT: dict[str, tuple[str, ...]] = {
    "runs.step": ("run_id", "step_no"),
    "jobs.work": ("work_item_id",),
    "jobs.work_drain": ("work_queue", "drain_slot"),
}


@signals.setup_logging.connect
def _logging_from_django(**kwargs: Any) -> None:
    """Celery logs through Django's LOGGING (the structured pipeline), not its own format."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


@signals.before_task_publish.connect
def _trace_headers(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """Every message carries the sender's trace (a relay sets the event's own)."""
    from jobs import tracing

    if headers is None or headers.get("traceparent"):
        return
    child = tracing.traceparent_child(tracing.traceparent_current())
    if child:
        headers["traceparent"] = child


@signals.task_prerun.connect
def _task_started(task_id: str = "", task: Any = None, args: Any = None, **kwargs: Any) -> None:
    import structlog

    from jobs import tracing

    if getattr(getattr(task, "request", None), "is_eager", False):
        return  # run inline by its caller, in the caller's context
    structlog.contextvars.clear_contextvars()
    context: dict[str, Any] = {"celery_task_id": task_id, "celery_task": getattr(task, "name", "")}
    names = _TASK_ARG_CONTEXT.get(getattr(task, "name", ""), ())
    for name, value in zip(names, args or (), strict=False):
        context[name] = value
    structlog.contextvars.bind_contextvars(**context)
    request = getattr(task, "request", None)
    incoming = getattr(request, "traceparent", None) or (
        (getattr(request, "headers", None) or {}).get("traceparent")
    )
    tracing.trace_activate(tracing.traceparent_child(incoming))
    from agentplatform import otel

    if otel.otel_configure():
        opened = otel.span_start(
            getattr(task, "name", "celery task"),
            kind="consumer",
            attributes={"messaging.system": "celery", "messaging.message.id": task_id},
        )
        if opened is not None:
            _open_spans[task_id] = opened


@signals.task_postrun.connect
def _task_finished(task_id: str = "", task: Any = None, state: str = "", **kwargs: Any) -> None:
    import structlog

    from jobs import tracing

    if getattr(getattr(task, "request", None), "is_eager", False):
        return

    opened = _open_spans.pop(task_id, None)
    if opened is not None:
        failed = state not in ("SUCCESS", "RETRY", "")
        opened.end(RuntimeError(f"task ended {state}") if failed else None)
    tracing.trace_clear()
    structlog.contextvars.clear_contextvars()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _database_connections_tidy(sender: Any = None, **kwargs: Any) -> None:
    """Keep the worker's connection across tasks, as a web request keeps it across requests.

    Celery's Django fix-up closes every connection before and after each task unless
    ``CELERY_DB_REUSE_MAX`` says otherwise (it does: see settings), which would cost a new
    PostgreSQL connection per task. Django's own rule applies instead: a connection is
    closed when it is older than ``CONN_MAX_AGE`` or broke (a health check on next use).
    """
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections, connection

    close_old_connections()
    if getattr(sender, "name", "") in _CHECKS_OWN_CONNECTION and connection.connection is not None:
        # Skips the health check (a ``SELECT 1`` round trip before every step): the
        # step's first statement, the lease, replaces a dead connection and runs again.
        connection.health_check_done = True  # type: ignore[attr-defined]


# When each task this process is running began (monotonic), by Celery task id.
_task_started_at: dict[str, float] = {}
_TASK_OUTCOMES = {"SUCCESS": "succeeded", "FAILURE": "failed", "RETRY": "retried"}


@signals.task_prerun.connect
def _task_clock_start(task_id: str = "", task: Any = None, **kwargs: Any) -> None:
    if not getattr(getattr(task, "request", None), "is_eager", False):
        _task_started_at[task_id] = time.monotonic()


@signals.task_postrun.connect
def _task_counted(task_id: str = "", task: Any = None, state: str = "", **kwargs: Any) -> None:
    """Count and time every task a worker runs (eager ones belong to their caller)."""
    started = _task_started_at.pop(task_id, None)
    if started is None:
        return
    # Imported here: the metrics store is chosen by the first import of prometheus-client,
    # which must follow Django's settings (jobs.metrics), not precede them.
    from agentplatform import metrics

    name = getattr(task, "name", "") or "unknown"
    outcome = _TASK_OUTCOMES.get(state, str(state).lower() or "unknown")
    metrics.celery_tasks.labels(name, outcome).inc()
    metrics.celery_task_seconds.labels(name).observe(time.monotonic() - started)


# Tasks whose first statement replaces a dead connection itself (runs.lease).
_CHECKS_OWN_CONNECTION = frozenset({"runs.step"})


@signals.worker_init.connect
@signals.worker_process_init.connect
def _loaded_objects_freeze(**kwargs: Any) -> None:
    # A worker's main process before it forks its pool, and each pool process.
    from agentplatform.startup import loaded_objects_freeze

    loaded_objects_freeze()


@signals.worker_init.connect
def _sandbox_containment_required(**kwargs: Any) -> None:
    """A worker that could not contain the agent's commands refuses to start (SystemExit:
    Celery logs and swallows ordinary exceptions raised by signal handlers)."""
    from agentplatform.checks import CONTAINMENT_HINT, containment_errors

    errors = containment_errors()
    if errors:
        lines = [f"{error.id}: {error.msg}" for error in errors]
        raise SystemExit(
            "\n".join(["The worker cannot contain commands:", *lines, CONTAINMENT_HINT])
        )


@signals.worker_process_init.connect
def _otel_after_fork(**kwargs: Any) -> None:
    # The batch exporter's thread does not survive the fork into a pool process.
    from agentplatform import otel

    otel.otel_configure(force=True)


@signals.celeryd_after_setup.connect
def _worker_queues_settle(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """The queues this worker consumes, settled before its pool processes fork.

    A worker of the "events" queue also serves the relay's queue. The relay has a queue
    of its own so that a backlog of consumer and delivery messages never stands in front
    of it; with the Redis transport's round robin over a worker's queues, a relay message
    waits for at most one message of each other queue. Any worker deployed for "events"
    keeps publishing without naming the new queue.

    Then the result is recorded for the pool processes: a step slice goes on with a
    run's next step when this worker consumes that step's queue
    (``runs.dispatch.served_here`` reads ``jobs.workers.queues_served``).
    """
    from jobs.workers import queues_served_set

    queues = (instance.app if instance is not None else app).amqp.queues
    names = {q.name for q in queues.consume_from.values()}
    if "events" in names and "relay" not in names:
        from kombu import Queue

        queues.select_add(Queue("relay"))
        names.add("relay")
    queues_served_set(names)


@signals.celeryd_after_setup.connect
def _model_client_preload(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """A worker of the ``agent`` queue loads the model client (LiteLLM) and the
    tokenizer's vocabulary at start, before its pool forks or its threads start: loaded
    by the first turn instead, they cost a few CPU-seconds while the first runs wait on
    the import lock (half of the agent worker's CPU in a 30-run benchmark)."""
    queues = (instance.app if instance is not None else app).amqp.queues
    if "agent" not in {q.name for q in queues.consume_from.values()}:
        return
    from agentplatform.startup import loaded_objects_freeze
    from runs.agent.profiles import tokens_estimate
    from runs.providers import llm  # noqa: F401  (the import is the point)

    tokens_estimate("preload")
    loaded_objects_freeze()


# This process's heartbeat writer, while it is a ready worker (see jobs.workers).
_heartbeater: Any = None


@signals.worker_ready.connect
def _worker_heartbeat_start(sender: Any = None, **kwargs: Any) -> None:
    global _heartbeater
    from jobs.workers import WorkerHeartbeater

    queues = sorted(q.name for q in app.amqp.queues.consume_from.values())
    concurrency = int(getattr(getattr(sender, "controller", None), "concurrency", 0) or 0)
    _heartbeater = WorkerHeartbeater(
        name=getattr(sender, "hostname", "") or "worker", queues=queues, concurrency=concurrency
    )
    _heartbeater.start()


@signals.worker_shutdown.connect
def _worker_heartbeat_stop(**kwargs: Any) -> None:
    if _heartbeater is not None:
        _heartbeater.stop()
