"""The operations dashboard reports the platform's numbers and flags the bad ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import redis
import time_machine
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from agentplatform.dashboard import dashboard_metrics, duration_percentiles
from runs.models import Run
from runs.spend import workspace_spend_add
from tests.factories import (
    DeadLetterFactory,
    OutboxEventFactory,
    RunFactory,
    UserFactory,
    WorkspaceFactory,
)

NOW = datetime(2030, 5, 17, 12, 30, tzinfo=UTC)


def _finished(status: str, minutes_ago: float, duration_s: float, **extra: Any) -> Run:
    end = NOW - timedelta(minutes=minutes_ago)
    run = RunFactory(status=status, **extra)
    Run.objects.filter(pk=run.pk).update(
        started_at=end - timedelta(seconds=duration_s), finished_at=end, status_changed_at=end
    )
    return run


def _queues_empty(client: redis.Redis) -> None:
    """Every queue's lists, one per broker priority step (kombu names them
    ``<queue>\x06\x16<step>``), whatever steps earlier tests published to."""
    for name in ("agent", "verify", "events", "webhooks", "relay"):
        client.delete(name, *client.scan_iter(match=f"{name}\x06\x16*"))


@pytest.fixture
def broker() -> Any:
    """This run's broker database (REDIS_URL), with empty queues before and after."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    _queues_empty(client)
    yield client
    _queues_empty(client)


@time_machine.travel(NOW, tick=False)
def test_throughput_success_rate_and_percentiles(db: Any, broker: Any) -> None:
    for i in range(10):
        _finished(Run.Status.COMPLETED, minutes_ago=5 + i, duration_s=60 * (i + 1))
    _finished(Run.Status.FAILED, minutes_ago=10, duration_s=30)
    _finished(Run.Status.FAILED, minutes_ago=300, duration_s=30)
    _finished(Run.Status.CANCELLED, minutes_ago=20, duration_s=30)
    _finished(Run.Status.COMPLETED, minutes_ago=60 * 30, duration_s=9999)  # older than a day

    metrics = dashboard_metrics(now=NOW)
    numbers = {m.label: m.value for m in metrics["throughput"]}

    assert numbers["completed (1h)"] == 10
    assert numbers["failed (1h)"] == 1
    assert numbers["failed (24h)"] == 2
    assert numbers["success rate (24h)"] == pytest.approx(10 / 12)
    # Durations of 60, 120, ... 600 s, interpolated between closest ranks.
    assert numbers["p50 duration"] == pytest.approx(330.0)
    assert numbers["p95 duration"] == pytest.approx(573.0)
    assert sum(sum(c.values()) for _, c in metrics["runs_per_hour"]) == 13
    assert dict(metrics["duration_histogram"])["1-2m"] == 1
    assert sum(n for _, n in metrics["duration_histogram"]) == 10


def test_percentiles_interpolate_between_closest_ranks(db: Any) -> None:
    now = timezone.now()
    for seconds in (10, 20, 30, 40, 100):
        run = RunFactory(status=Run.Status.COMPLETED)
        Run.objects.filter(pk=run.pk).update(
            started_at=now - timedelta(seconds=seconds), finished_at=now, status_changed_at=now
        )
    p50, p95 = duration_percentiles(now - timedelta(hours=1))
    assert p50 == pytest.approx(30.0, abs=0.01)
    assert p95 == pytest.approx(40 + 0.8 * 60, abs=0.01)


def test_queue_depth_outbox_lag_dead_letters_and_leases_cross_thresholds(
    db: Any,
    broker: Any,
) -> None:
    broker.rpush("agent", *[b"m"] * 150)
    broker.rpush("verify\x06\x163", b"m")
    now = timezone.now()
    OutboxEventFactory()
    from jobs.models import OutboxEvent

    OutboxEvent.objects.update(created_at=now - timedelta(minutes=5))
    DeadLetterFactory()
    RunFactory(
        status=Run.Status.RUNNING,
        lease_owner="w",
        lease_until=now - timedelta(seconds=5),
        heartbeat_at=now - timedelta(minutes=2),
    )

    metrics = dashboard_metrics(now=now)
    queues = {m.label: m for m in metrics["queues"]}
    health = {m.label: m for m in metrics["health"]}

    assert (queues["agent"].value, queues["agent"].tone) == (150, "warn")
    assert (queues["verify"].value, queues["verify"].tone) == (1, "")
    assert health["outbox lag"].tone == "bad" and health["outbox lag"].value >= 300
    assert (health["open dead letters"].value, health["open dead letters"].tone) == (1, "bad")
    assert health["oldest lease age"].tone == "bad"
    assert dict(metrics["active_by_state"])["running"] == 1


def test_spend_today_per_workspace_against_its_budget(db: Any, broker: Any) -> None:
    rich = WorkspaceFactory(slug="rich")
    tight = WorkspaceFactory(slug="tight", daily_cost_budget_usd=Decimal("1.00"))
    workspace_spend_add(workspace_id=rich.pk, cost=Decimal("3.5"))
    workspace_spend_add(workspace_id=tight.pk, cost=Decimal("0.9"))
    # Spent yesterday: not today's.
    workspace_spend_add(
        workspace_id=tight.pk, cost=Decimal("5"), at=timezone.now() - timedelta(days=1)
    )

    rows = {r["workspace"]: r for r in dashboard_metrics()["cost_today"]}

    assert rows["rich"]["cost"] == Decimal("3.5") and rows["rich"]["tone"] == ""
    assert rows["tight"]["cost"] == Decimal("0.9") and rows["tight"]["tone"] == "warn"


def test_every_configured_queue_is_shown_the_relay_s_included(
    client: Any, db: Any, broker: Any
) -> None:
    broker.rpush("relay", *[b"m"] * 3)
    queues = {m.label: m.value for m in dashboard_metrics()["queues"]}
    assert queues == {"agent": 0, "verify": 0, "events": 0, "webhooks": 0, "relay": 3}

    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    html = client.get(reverse("ops-dashboard")).content.decode()
    assert 'data-metric="queue-relay"' in html

    from prometheus_client.parser import text_string_to_metric_families

    gauge = {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").content.decode())
        for sample in family.samples
        if sample.name == "agent_queue_depth"
    }
    assert gauge["relay"] == 3


def test_dashboard_page_renders_charts_and_is_linked_from_the_admin_index(
    client: Any,
    db: Any,
    broker: Any,
) -> None:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    _finished(Run.Status.COMPLETED, minutes_ago=0, duration_s=90)
    RunFactory.create_batch(5)

    index = client.get(reverse("admin:index")).content.decode()
    assert reverse("ops-dashboard") in index
    response = client.get(reverse("ops-dashboard"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="chart-runs-per-hour"' in html and 'id="chart-durations"' in html
    assert 'data-metric="queue-agent"' in html


def test_the_default_brokers_depths_are_numbers(db: Any, broker: Any) -> None:
    """The broker the settings chose (the embedded Valkey when nothing is configured)
    answers every queue's depth."""
    queues = dashboard_metrics()["queues"]
    assert {m.label for m in queues} >= {"agent", "verify", "events", "webhooks", "relay"}
    assert all(isinstance(m.value, int) for m in queues), [(m.label, m.display) for m in queues]


def test_depths_read_not_available_while_the_broker_is_down(db: Any, settings: Any) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"
    queues = dashboard_metrics()["queues"]
    assert {m.display for m in queues} == {"n/a"}
