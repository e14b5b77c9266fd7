"""``GET /metrics``: the Prometheus exposition of every process, plus state read at scrape.

Open to loopback clients that did not come through a proxy; anyone else needs
``Authorization: Bearer $METRICS_TOKEN`` or an address in ``METRICS_ALLOWED_NETWORKS``.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from agentplatform import metrics
from agentplatform.celery import app as celery_app
from agentplatform.dashboard import queue_depths
from jobs.logs import log
from jobs.models import DeadLetter, OutboxEvent
from runs.agent.tools import TOOL_NAMES
from runs.models import Repository, Run, Task, Workspace
from runs.state import ACTIVE
from webhooks import metrics as webhook_metrics

_PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _age(moment: datetime | None) -> float:
    return max(0.0, (timezone.now() - moment).total_seconds()) if moment else 0.0


class PlatformStateCollector(Collector):
    """Gauges computed from the database and the broker at scrape time.

    One failing source (the broker down, a slow query) leaves its gauge out of this scrape
    instead of failing the whole answer.
    """

    def collect(self) -> Iterator[Metric]:
        for source in (
            self._outbox,
            self._queues,
            self._dead_letters,
            self._leases,
            self._active_runs,
        ):
            try:
                yield from source()
            except Exception:
                log.warning("metrics.collect_failed", source=source.__name__, exc_info=True)

    def _outbox(self) -> Iterator[Metric]:
        pending = OutboxEvent.objects.filter(published_at__isnull=True)
        oldest = pending.order_by("id").values_list("created_at", flat=True).first()
        yield GaugeMetricFamily(
            "agent_outbox_lag_seconds",
            "Age of the oldest unpublished outbox event (0 when drained).",
            value=_age(oldest),
        )
        yield GaugeMetricFamily(
            "agent_outbox_pending", "Outbox events not yet published.", value=pending.count()
        )

    def _queues(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "agent_queue_depth", "Messages waiting in each broker queue.", labels=["queue"]
        )
        for queue, depth in queue_depths().items():
            if depth is not None:
                family.add_metric([queue], depth)
        yield family

    def _dead_letters(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "agent_dead_letters_open",
            "Dead letters nobody has requeued or resolved yet.",
            value=DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count(),
        )

    def _leases(self) -> Iterator[Metric]:
        oldest = (
            Run.objects.filter(status__in=ACTIVE, lease_until__isnull=False)
            .order_by("heartbeat_at")
            .values_list("heartbeat_at", flat=True)
            .first()
        )
        yield GaugeMetricFamily(
            "agent_oldest_lease_age_seconds",
            "Seconds since the last heartbeat of the oldest lease held by an active run.",
            value=_age(oldest),
        )

    def _active_runs(self) -> Iterator[Metric]:
        counts = dict(
            Run.objects.filter(status__in=ACTIVE)
            .order_by()
            .values("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        )
        family = GaugeMetricFamily(
            "agent_runs_active", "Runs not yet ended, by status.", labels=["status"]
        )
        for status in sorted(ACTIVE):
            family.add_metric([str(status)], counts.get(status, 0))
        yield family


_closed_sets_present = False


def series_present() -> None:
    """Put every series of a known label set in the store at 0, so a dashboard panel and a
    ``rate()`` alert see a flat line from the start instead of no data until the first
    increment. A child created by ``labels()`` writes its 0 to this process's file."""
    global _closed_sets_present
    for slug in Workspace.objects.order_by().values_list("slug", flat=True):
        metrics.cost_usd.labels(slug)
    if _closed_sets_present:
        return
    for risk in Task.Risk.values:
        for source in Task.Source.values:
            metrics.tasks_submitted.labels("change", risk, source)
    for outcome in ("completed", "failed", "cancelled", "timed_out"):
        metrics.runs_completed.labels(outcome)
    for tool in sorted(TOOL_NAMES):
        for status in ("completed", "failed", "denied", "timed_out"):
            metrics.tool_calls.labels(tool, status)
    for verdict in ("accept", "revise", "block"):
        metrics.judge_verdicts.labels(verdict)
    for provider in Repository.Provider.values:
        metrics.prs_created.labels(provider)
    for provider in (Repository.Provider.GITHUB, Repository.Provider.GITLAB):
        for result in ("accepted", "duplicate"):
            webhook_metrics.deliveries.labels(provider=provider, result=result)
        for status in ("processed", "ignored", "failed"):
            webhook_metrics.processed.labels(provider=provider, status=status)
        for reason in ("missing", "no_secret", "mismatch"):
            webhook_metrics.signature_failures.labels(provider=provider, reason=reason)
    # A web process imports the apps' task modules only when asked: the worker's own list.
    celery_app.loader.import_default_modules()
    for name in sorted(celery_app.tasks):
        if not name.startswith("celery."):
            for outcome in ("succeeded", "failed", "retried"):
                metrics.celery_tasks.labels(name, outcome)
    _closed_sets_present = True


def exposition() -> bytes:
    """The text exposition: every process's counters and histograms, then the state."""
    try:
        series_present()
    except Exception:
        log.warning("metrics.series_present_failed", exc_info=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics.multiprocess_dir()))
    registry.register(PlatformStateCollector())
    return generate_latest(registry)


def _client_allowed(request: HttpRequest) -> bool:
    if any(request.META.get(header) for header in _PROXY_HEADERS):
        # Through a proxy on this host the peer is loopback for everyone.
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    for network in settings.METRICS_ALLOWED_NETWORKS:
        if address in ipaddress.ip_network(network, strict=False):
            return True
    return False


def _token_valid(request: HttpRequest) -> bool:
    expected = settings.METRICS_TOKEN
    if not expected:
        return False
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())


def _refusal(status: int, title: str, detail: str) -> JsonResponse:
    response = JsonResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status=status,
        content_type="application/problem+json",
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not (_client_allowed(request) or _token_valid(request)):
        if settings.METRICS_TOKEN:
            return _refusal(
                401, "Unauthorized", "Send Authorization: Bearer <METRICS_TOKEN> to read metrics."
            )
        return _refusal(
            403,
            "Forbidden",
            "Metrics are open to loopback clients and METRICS_ALLOWED_NETWORKS; "
            "set METRICS_TOKEN to allow others.",
        )
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
