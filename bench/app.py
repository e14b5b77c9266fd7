"""The platform's Celery app as the benchmark runs it: no-op step handlers, task counts.

``celery -A bench.app worker`` runs the real step protocol (lease, heartbeat, fenced
commit, timeline, outbox, dispatch) with handlers that do nothing but move the run to its
next status, so what is measured is the platform's bookkeeping, not git or a model.
Every task run is counted in the Redis hash ``bench:tasks`` (by task name).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from celery import signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from agentplatform.celery import app

__all__ = ["app"]

_redis: Any = None


def noop_handlers() -> dict[str, Any]:
    from runs.models import Run
    from runs.protocol import Outcome

    S = Run.Status
    chain = [
        S.QUEUED,
        S.PREPARING,
        S.CONTEXT_LOADING,
        S.PLANNING,
        S.RUNNING,
        S.VERIFYING,
        S.JUDGING,
        S.CREATING_PR,
        S.COMPLETED,
    ]

    def make(target: str) -> Any:
        return lambda ctx: Outcome(to=target)

    def first(ctx: Any) -> Any:
        # When the first step's work begins: the end of the wake-up latency measured.
        if _redis is not None:
            _redis.set(f"bench:started:{ctx.run.id}", time.time(), ex=600)
        return Outcome(to=S.PREPARING)

    handlers = {source: make(target) for source, target in itertools.pairwise(chain)}
    handlers[S.QUEUED] = first
    return handlers


@signals.worker_process_init.connect
@signals.worker_init.connect
def _install(**kwargs: Any) -> None:
    global _redis
    import redis

    from runs import engine

    _redis = redis.Redis.from_url(os.environ["REDIS_URL"])

    handlers = noop_handlers()
    engine.HANDLERS = handlers  # type: ignore[assignment]


@signals.task_postrun.connect
def _count(sender: Any = None, **kwargs: Any) -> None:
    # After the task, not before: a Redis round trip of the benchmark's own must not sit
    # between a wake-up and the step's start (figure 2) when the baseline has none there.
    if _redis is not None:
        _redis.hincrby("bench:tasks", getattr(sender, "name", "?"), 1)
