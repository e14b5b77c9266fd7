"""Liveness and readiness probes for load balancers."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse

from agentplatform.celery import app
from jobs.workers import queues_without_live_worker


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is alive and serving."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Database reachable with every migration applied, broker reachable, and (with
    ``READYZ_REQUIRE_WORKERS``) a live worker for every task queue."""
    checks: dict[str, str] = {}
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        checks["database"] = "ok" if not pending else f"{len(pending)} migrations pending"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    if settings.READYZ_REQUIRE_WORKERS:
        try:
            missing = queues_without_live_worker(
                queues=[queue.name for queue in settings.CELERY_TASK_QUEUES]
            )
            checks["workers"] = (
                "ok" if not missing else f"no live worker for queue {', '.join(missing)}"
            )
        except Exception as exc:
            checks["workers"] = f"error: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )
