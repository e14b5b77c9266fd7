"""The console's workers page: who is alive, where, on which queues, running what."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from jobs.workers import workers_listed
from runs.models import Run
from runs.state import ACTIVE


def workers_context(*, now: Any = None) -> list[dict[str, Any]]:
    """Each worker with the runs its host's processes hold a live lease on."""
    now = now or timezone.now()
    rows = workers_listed(now=now)
    hosts = {row["worker"].hostname for row in rows if row["alive"]}
    leased: dict[str, list[Run]] = {}
    if hosts:
        # A lease owner is "<hostname>:<pid>:<nonce>" (runs.lease.worker_identity).
        for run in (
            Run.objects.filter(status__in=ACTIVE, lease_until__gte=now)
            .exclude(lease_owner="")
            .select_related("task__repository")
            .only("id", "run_no", "status", "step_no", "lease_owner", "task__repository__name")
            .order_by("lease_owner")[:200]
        ):
            leased.setdefault(run.lease_owner.split(":", 1)[0], []).append(run)
    for row in rows:
        worker = row["worker"]
        row["runs"] = leased.get(worker.hostname, []) if row["alive"] else []
        row["silent_seconds"] = int((now - worker.last_heartbeat_at).total_seconds())
    return rows


def workers(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Workers",
        "workers": workers_context(),
    }
    return TemplateResponse(request, "ops/workers.html", context)


workers_view = admin.site.admin_view(workers)
