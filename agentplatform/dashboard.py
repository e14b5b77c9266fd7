"""The operations dashboard: is the platform healthy, and where is work piling up?

Every number comes from one indexed query (or the broker), so the page stays fast with
hundreds of thousands of runs: the time-window queries filter terminal runs on
``(status, status_changed_at)`` (index ``run_status_changed``; a terminal run's
status_changed_at is its finish time), active runs are a small slice of the same index,
and today's cost reads ``run_created``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import TruncHour
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from agentplatform.celery import app
from jobs.models import DeadLetter, OutboxEvent
from jobs.relay import outbox_lag_seconds
from runs import fairness
from runs.models import Run, WorkspaceSpend
from runs.reaper import oldest_lease_age_seconds
from runs.state import ACTIVE, TERMINAL

# kombu's Redis transport keeps one list per priority step; priority 0 is the bare name.
REDIS_PRIORITY_SEPARATOR = "\x06\x16"
REDIS_PRIORITY_STEPS = tuple(range(1, 10))

OUTCOMES = (Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.TIMED_OUT, Run.Status.CANCELLED)
OUTCOME_COLOURS = {
    Run.Status.COMPLETED: "#43a047",
    Run.Status.FAILED: "#e53935",
    Run.Status.TIMED_OUT: "#8e24aa",
    Run.Status.CANCELLED: "#9e9e9e",
}
# Upper bounds (seconds) of the duration histogram's buckets; the last is open-ended.
DURATION_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<1m", 60),
    ("1-2m", 120),
    ("2-5m", 300),
    ("5-10m", 600),
    ("10-30m", 1800),
    ("30-60m", 3600),
    (">1h", math.inf),
)


def threshold(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


# --- measurements -----------------------------------------------------------------------------


def queue_names() -> list[str]:
    """Every queue the platform routes work to (the relay's included), as configured."""
    return [queue.name for queue in settings.CELERY_TASK_QUEUES]


def queue_depths() -> dict[str, int | None]:
    """Messages waiting per Celery queue; None where the broker did not answer."""
    url = settings.CELERY_BROKER_URL
    queues = queue_names()
    if url.startswith(("redis://", "rediss://")):
        return _redis_queue_depths(url, queues)
    return _amqp_queue_depths(queues)


def _redis_queue_depths(url: str, queues: list[str]) -> dict[str, int | None]:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        pipe = client.pipeline(transaction=False)
        for name in queues:
            pipe.llen(name)
            for step in REDIS_PRIORITY_STEPS:
                pipe.llen(f"{name}{REDIS_PRIORITY_SEPARATOR}{step}")
        lengths = pipe.execute()
    except Exception:  # the dashboard must render while the broker is down
        return dict.fromkeys(queues)
    per_queue = 1 + len(REDIS_PRIORITY_STEPS)
    return {
        name: sum(lengths[i * per_queue : (i + 1) * per_queue]) for i, name in enumerate(queues)
    }


def _amqp_queue_depths(queues: list[str]) -> dict[str, int | None]:
    depths: dict[str, int | None] = dict.fromkeys(queues)
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=1)
            for name in queues:
                try:
                    # A passive declare reports the count without creating the queue;
                    # it closes the channel when the queue is missing, so one per queue.
                    channel: Any = conn.channel()
                    depths[name] = channel.queue_declare(queue=name, passive=True).message_count
                    channel.close()
                except Exception:
                    depths[name] = None
    except Exception:  # broker down: every depth stays unknown
        return dict.fromkeys(queues)
    return depths


def duration_percentiles(since: datetime) -> tuple[float | None, float | None]:
    """p50 and p95 of completed runs' durations (seconds) finished since ``since``."""
    # PostgreSQL's percentile_cont, in one statement the planner serves from the
    # (status, status_changed_at) index.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP "  # noqa: S608
            "(ORDER BY EXTRACT(EPOCH FROM finished_at - started_at)) "
            f"FROM {Run._meta.db_table} WHERE status = %s AND status_changed_at >= %s "
            "AND started_at IS NOT NULL AND finished_at IS NOT NULL",
            [Run.Status.COMPLETED.value, since],
        )
        row = cursor.fetchone()
    if not row or row[0] is None:
        return None, None
    p50, p95 = row[0]
    return float(p50), float(p95)


def duration_histogram(since: datetime) -> list[tuple[str, int]]:
    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    counts: dict[str, Any] = {}
    lower = 0.0
    for _label, upper in DURATION_BUCKETS:
        condition = Q(duration__gte=timedelta(seconds=lower))
        if upper != math.inf:
            condition &= Q(duration__lt=timedelta(seconds=upper))
        counts[f"b{len(counts)}"] = Count("id", filter=condition)
        lower = upper
    row = (
        Run.objects.filter(
            status=Run.Status.COMPLETED,
            status_changed_at__gte=since,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .annotate(duration=duration)
        .aggregate(**counts)
    )
    return [(label, row[f"b{i}"] or 0) for i, (label, _) in enumerate(DURATION_BUCKETS)]


def runs_per_hour(now: datetime, hours: int = 24) -> list[tuple[datetime, dict[str, int]]]:
    """Runs that ended in each of the last ``hours`` hours, by outcome."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    rows = (
        Run.objects.filter(status__in=TERMINAL, status_changed_at__gte=start)
        .annotate(hour=TruncHour("status_changed_at"))
        .order_by()
        .values("hour", "status")
        .annotate(n=Count("id"))
    )
    buckets: dict[datetime, dict[str, int]] = {
        start + timedelta(hours=i): dict.fromkeys(OUTCOMES, 0) for i in range(hours)
    }
    for row in rows:
        bucket = buckets.get(row["hour"])
        if bucket is not None:
            bucket[row["status"]] = row["n"]
    return sorted(buckets.items())


@dataclass
class Metric:
    label: str
    value: Any
    display: str
    tone: str = ""  # "", "warn" or "bad": the card is highlighted
    hint: str = ""


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def dashboard_metrics(*, now: datetime | None = None) -> dict[str, Any]:
    """Every number on the dashboard, with its threshold tone."""
    now = now or timezone.now()
    day_ago = now - timedelta(days=1)
    active = active_by_state()
    per_hour = runs_per_hour(now)
    histogram = duration_histogram(day_ago)
    return {
        "now": now,
        "queues": queue_tiles(),
        "health": health_tiles(active),
        "throughput": throughput_tiles(now),
        "active_by_state": active,
        "fairness": fairness.workspace_queues(now),
        "cost_today": cost_today(now),
        "runs_per_hour": per_hour,
        "duration_histogram": histogram,
        "runs_per_hour_svg": runs_per_hour_svg(per_hour),
        "duration_svg": histogram_svg(histogram),
    }


def queue_tiles() -> list[Metric]:
    """Each queue's depth in the broker, warned at OPS_QUEUE_DEPTH_WARN."""
    depths = queue_depths()
    depth_warn = threshold("OPS_QUEUE_DEPTH_WARN", 100)
    return [
        Metric(
            name,
            depth,
            "n/a" if depth is None else str(depth),
            "warn" if depth is not None and depth >= depth_warn else "",
        )
        for name, depth in depths.items()
    ]


def active_by_state() -> list[tuple[str, int]]:
    """Active runs per status, every active status listed (zero included)."""
    by_state = dict(
        Run.objects.filter(status__in=ACTIVE)
        .order_by()
        .values("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return [(status, by_state.get(status, 0)) for status in Run.Status.values if status in ACTIVE]


def health_tiles(active: list[tuple[str, int]]) -> list[Metric]:
    """Outbox lag, open dead letters, the oldest lease and the active runs."""
    lag = outbox_lag_seconds()
    lag_warn = threshold("OPS_OUTBOX_LAG_WARN_SECONDS", 30)
    outbox_pending = OutboxEvent.objects.filter(published_at__isnull=True).count()
    open_letters = DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count()
    lease_age = oldest_lease_age_seconds()
    lease_warn = threshold("OPS_LEASE_AGE_WARN_SECONDS", settings.RUN_LEASE_SECONDS)
    return [
        Metric(
            "outbox lag",
            lag,
            _seconds(lag),
            "bad" if lag >= lag_warn * 4 else "warn" if lag >= lag_warn else "",
            f"{outbox_pending} pending",
        ),
        Metric("open dead letters", open_letters, str(open_letters), "bad" if open_letters else ""),
        Metric(
            "oldest lease age",
            lease_age,
            _seconds(lease_age),
            "bad" if lease_age >= lease_warn else "",
        ),
        Metric("active runs", sum(n for _, n in active), str(sum(n for _, n in active))),
    ]


def throughput_tiles(now: datetime) -> list[Metric]:
    """Runs finished in the last hour and day, the success rate and the durations."""
    hour_ago, day_ago = now - timedelta(hours=1), now - timedelta(days=1)
    window = Run.objects.filter(status__in=TERMINAL, status_changed_at__gte=day_ago).aggregate(
        completed_hour=Count(
            "id", filter=Q(status=Run.Status.COMPLETED, status_changed_at__gte=hour_ago)
        ),
        failed_hour=Count(
            "id",
            filter=Q(
                status__in=[Run.Status.FAILED, Run.Status.TIMED_OUT],
                status_changed_at__gte=hour_ago,
            ),
        ),
        completed_day=Count("id", filter=Q(status=Run.Status.COMPLETED)),
        failed_day=Count("id", filter=Q(status__in=[Run.Status.FAILED, Run.Status.TIMED_OUT])),
        cancelled_day=Count("id", filter=Q(status=Run.Status.CANCELLED)),
    )
    # Cancelled runs are an operator's decision, not a failure of the platform.
    decided = window["completed_day"] + window["failed_day"]
    success = window["completed_day"] / decided if decided else None
    success_warn = threshold("OPS_SUCCESS_RATE_WARN", 0.8)
    p50, p95 = duration_percentiles(day_ago)
    return [
        Metric("completed (1h)", window["completed_hour"], str(window["completed_hour"])),
        Metric(
            "failed (1h)",
            window["failed_hour"],
            str(window["failed_hour"]),
            "warn" if window["failed_hour"] else "",
        ),
        Metric("completed (24h)", window["completed_day"], str(window["completed_day"])),
        Metric("failed (24h)", window["failed_day"], str(window["failed_day"])),
        Metric(
            "success rate (24h)",
            success,
            "-" if success is None else f"{success:.0%}",
            "bad" if success is not None and success < success_warn else "",
            f"{window['cancelled_day']} cancelled",
        ),
        Metric("p50 duration", p50, _seconds(p50)),
        Metric("p95 duration", p95, _seconds(p95)),
    ]


def cost_today(now: datetime) -> list[dict[str, Any]]:
    """Each workspace's model spend today against its daily budget, highest first."""
    # The same daily totals the admission's budget check reads: one row per workspace
    # that spent today, whatever the number of runs.
    costs = (
        WorkspaceSpend.objects.filter(day=now.astimezone(UTC).date())
        .values("workspace__slug", "workspace__daily_cost_budget_usd", "cost_usd")
        .order_by("-cost_usd")
    )
    cost_rows = []
    for row in costs:
        budget = row["workspace__daily_cost_budget_usd"] or Decimal("0")
        spent = row["cost_usd"]
        tone = ""
        if budget > 0:
            tone = "bad" if spent >= budget else "warn" if spent >= budget * Decimal("0.8") else ""
        cost_rows.append(
            {"workspace": row["workspace__slug"], "cost": spent, "budget": budget, "tone": tone}
        )
    return cost_rows


# --- charts (inline SVG: the console works without any network access) ------------------------


def runs_per_hour_svg(series: list[tuple[datetime, dict[str, int]]]) -> SafeString:
    """A stacked bar per hour, one colour per outcome, with a legend."""
    width, height, left, bottom, top = 560, 200, 34, 22, 36
    bar_space = (width - left - 8) / max(1, len(series))
    peak = max([sum(counts.values()) for _, counts in series] + [1])
    scale = (height - bottom - top) / peak
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'role="img" aria-label="runs per hour by outcome" id="chart-runs-per-hour">',
        f'<text x="{left}" y="12" font-size="11" fill="#333">runs per hour by outcome '
        f"(last {len(series)}h, peak {peak})</text>",
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 4}" y2="{height - bottom}" '
        'stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 4}" font-size="10" text-anchor="end">{peak}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" font-size="10" text-anchor="end">0</text>',
    ]
    for i, (hour, counts) in enumerate(series):
        x = left + i * bar_space + 1
        y = float(height - bottom)
        for outcome in OUTCOMES:
            n = counts.get(outcome, 0)
            if not n:
                continue
            h = n * scale
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_space - 2:.1f}" height="{h:.1f}" '
                f'fill="{OUTCOME_COLOURS[outcome]}"><title>{escape(hour.strftime("%H:00"))} '
                f"{escape(outcome)}: {n}</title></rect>"
            )
        if i % 6 == 0:
            parts.append(
                f'<text x="{x:.1f}" y="{height - 8}" font-size="10" fill="#555">'
                f"{escape(hour.strftime('%H:00'))}</text>"
            )
    for j, outcome in enumerate(OUTCOMES):
        parts.append(
            f'<rect x="{left + j * 80}" y="18" width="9" height="9" '
            f'fill="{OUTCOME_COLOURS[outcome]}"/><text x="{left + j * 80 + 12}" '
            f'y="26" font-size="10">{escape(outcome)}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text is escaped


def histogram_svg(buckets: list[tuple[str, int]]) -> SafeString:
    width, height, left, bottom, top = 380, 190, 34, 22, 26
    bar_space = (width - left - 8) / max(1, len(buckets))
    peak = max([n for _, n in buckets] + [1])
    scale = (height - bottom - top) / peak
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'role="img" aria-label="run duration distribution" id="chart-durations">',
        f'<text x="{left}" y="12" font-size="11" fill="#333">duration of completed runs '
        f"(24h, peak {peak})</text>",
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 4}" y2="{height - bottom}" '
        'stroke="#999"/>',
    ]
    for i, (label, n) in enumerate(buckets):
        x = left + i * bar_space + 3
        h = n * scale
        parts.append(
            f'<rect x="{x:.1f}" y="{height - bottom - h:.1f}" width="{bar_space - 6:.1f}" '
            f'height="{h:.1f}" fill="#1e88e5"><title>{escape(label)}: {n}</title></rect>'
            f'<text x="{x + (bar_space - 6) / 2:.1f}" y="{height - 8}" font-size="10" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
        if n:
            parts.append(
                f'<text x="{x + (bar_space - 6) / 2:.1f}" '
                f'y="{height - bottom - h - 3:.1f}" font-size="10" '
                f'text-anchor="middle">{n}</text>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text is escaped


# --- the view ---------------------------------------------------------------------------------


def dashboard(request: HttpRequest) -> HttpResponse:
    """The operations dashboard, inside the admin (staff only, via admin_view)."""
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        "metrics": dashboard_metrics(),
    }
    return TemplateResponse(request, "ops/dashboard.html", context)


dashboard_view = admin.site.admin_view(dashboard)
