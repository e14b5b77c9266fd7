"""Prometheus metrics, correct across every web, worker and beat process of a deployment.

Two kinds, each exact in its own way:

* **Counters and histograms** (things that happen: a task submitted, a step taking 2 s, a
  tool call) use prometheus-client's multiprocess mode (see ``jobs.metrics``): a scrape
  of any web process sums the values of every process of the deployment on the host.
* **Gauges of state** (outbox lag, queue depth, open dead letters, oldest lease, active
  runs) are computed from the database and the broker when scraped, so they are the same
  whichever process answers and never go stale when a process dies.

Domain counters move when the fact commits: the timeline hands each committed batch of
events to :func:`events_observe`, so a step rolled back by a lost lease counts nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.metrics import Counter, Histogram

from jobs.logs import log
from jobs.metrics import multiprocess_dir, multiprocess_dir_reset
from runs.agent.profiles import profile_name_for

__all__ = ["events_observe", "multiprocess_dir", "multiprocess_dir_reset", "step_timed"]


# --- tasks and runs -------------------------------------------------------------------------

tasks_submitted = Counter(
    "agent_tasks_submitted",
    "Tasks submitted, by type, risk level and source (api, webhook, admin...).",
    ["task_type", "risk_level", "source"],
)
tasks_deferred = Counter(
    "agent_tasks_deferred", "Submissions deferred by admission control.", ["reason"]
)
runs_started = Counter("agent_runs_started", "Runs that began working.", ["model_profile"])
runs_completed = Counter(
    "agent_runs_completed",
    "Runs that ended, by outcome (completed, failed, cancelled, timed_out).",
    ["outcome"],
)
run_duration = Histogram(
    "agent_run_duration_seconds",
    "Wall-clock time from a run's start to its end.",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
step_duration = Histogram(
    "agent_step_duration_seconds",
    "Time one step's work took, by the run state it ran in.",
    ["step"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
tool_calls = Counter(
    "agent_tool_calls",
    "Agent tool calls by tool and status (completed, failed, denied, timed_out).",
    ["tool", "status"],
)
model_tokens = Counter(
    "agent_model_tokens", "Model tokens by model and direction (in, out).", ["model", "direction"]
)
cost_usd = Counter("agent_cost_usd", "Model spend in US dollars, by workspace.", ["workspace"])
verification_failures = Counter(
    "agent_verification_failures",
    "Verification attempts that did not pass, by category.",
    ["category"],
)
judge_verdicts = Counter("agent_judge_verdicts", "Judge verdicts on patches.", ["verdict"])
prs_created = Counter("agent_prs_created", "Pull or merge requests opened.", ["provider"])


# --- the processes' own work ----------------------------------------------------------------

http_requests = Counter(
    "agent_http_requests",
    "HTTP requests answered, by method, route pattern and status class (2xx, 4xx...).",
    ["method", "route", "status"],
)
http_request_seconds = Histogram(
    "agent_http_request_seconds",
    "Time from a request's arrival to its response, by method and route pattern.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
celery_tasks = Counter(
    "agent_celery_tasks",
    "Celery tasks a worker ran, by task name and outcome (succeeded, failed, retried).",
    ["task", "outcome"],
)
celery_task_seconds = Histogram(
    "agent_celery_task_seconds",
    "Time a worker spent running one Celery task, by task name.",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)


# --- event hook -----------------------------------------------------------------------------

_RUN_OUTCOMES = {
    "agent.run.completed": "completed",
    "agent.run.failed": "failed",
    "agent.run.cancelled": "cancelled",
    "agent.run.timed_out": "timed_out",
}
_TOOL_STATUS = {
    "agent.tool.call.completed": "completed",
    "agent.tool.call.failed": "failed",
    "agent.tool.call.denied": "denied",
    "agent.tool.call.timed_out": "timed_out",
}


def _label(value: Any, default: str = "unknown") -> str:
    text = str(value).strip() if value not in (None, "") else ""
    return text[:100] or default


def _profile_of(task: Any, run: Any) -> str:
    """The model profile the run uses (task, then repository, then workspace, then default)."""
    if getattr(run, "model_profile", ""):
        return str(run.model_profile)

    return str(profile_name_for(task))


def _observe(task: Any, run: Any, type: str, data: dict[str, Any]) -> None:
    if type == "agent.task.submitted":
        tasks_submitted.labels(
            _label(task.task_type), _label(task.risk_level), _label(task.source)
        ).inc()
    elif type == "agent.task.deferred":
        # "workspace at its limit of 10 active runs": one series per kind, not per limit.
        reason = re.sub(r"\$?\d+(?:\.\d+)?", "N", str(data.get("reason") or ""))
        tasks_deferred.labels(_label(reason)).inc()
    elif type == "agent.run.started":
        runs_started.labels(_label(_profile_of(task, run), "default")).inc()
    elif type in _RUN_OUTCOMES:
        runs_completed.labels(_RUN_OUTCOMES[type]).inc()
        started = getattr(run, "started_at", None) or getattr(run, "created_at", None)
        if started is not None:
            from django.utils import timezone

            run_duration.observe(max(0.0, (timezone.now() - started).total_seconds()))
    elif type == "agent.model.turn.completed":
        model = _label(data.get("model") or getattr(run, "model_profile", ""))
        model_tokens.labels(model, "in").inc(max(0, int(data.get("tokens_in") or 0)))
        model_tokens.labels(model, "out").inc(max(0, int(data.get("tokens_out") or 0)))
        cost = float(data.get("cost_usd") or 0)
        if cost > 0:
            cost_usd.labels(_label(getattr(task.workspace, "slug", task.workspace_id))).inc(cost)
    elif type in _TOOL_STATUS:
        tool_calls.labels(_label(data.get("tool")), _TOOL_STATUS[type]).inc()
    elif type in ("agent.verification.failed", "agent.verification.errored"):
        fallback = type.rsplit(".", 1)[-1]
        category = _label(data.get("category") or data.get("outcome"), fallback)
        verification_failures.labels(category).inc()
    elif type == "agent.judge.completed":
        judge_verdicts.labels(_label(data.get("verdict"))).inc()
    elif type == "agent.pr.created":
        repository = getattr(task, "repository", None)
        prs_created.labels(_label(getattr(repository, "provider", ""))).inc()


def events_observe(task: Any, run: Any, events: Iterable[Any]) -> None:
    """Count the facts in a committed batch of events; never raises into the caller."""
    for event in events:
        try:
            _observe(task, run, event.type, dict(event.data or {}))
        except Exception:
            log.warning("metrics.observe_failed", event_type=event.type, exc_info=True)


@contextmanager
def step_timed(step: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        step_duration.labels(_label(step)).observe(time.monotonic() - started)
