"""Prometheus metrics of delivery: outbox lag, publishes, consumers, dead letters.

The gauges read the database when scraped (``set_function``), so they are exact at scrape
time and cost nothing between scrapes.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram


def _outbox_lag() -> float:
    from jobs.relay import outbox_lag_seconds

    try:
        return outbox_lag_seconds()
    except Exception:  # a scrape must not fail because the database blinked
        return float("nan")


def _outbox_pending() -> float:
    from jobs.relay import outbox_pending_count

    try:
        return float(outbox_pending_count())
    except Exception:
        return float("nan")


outbox_lag = Gauge(
    "agentplatform_outbox_lag_seconds", "Age of the oldest unpublished outbox event."
)
outbox_lag.set_function(_outbox_lag)
outbox_pending = Gauge("agentplatform_outbox_pending_events", "Outbox events not yet published.")
outbox_pending.set_function(_outbox_pending)

events_published = Counter(
    "agentplatform_outbox_events_published_total", "Outbox events published to every sink."
)
publish_failures = Counter(
    "agentplatform_outbox_publish_failures_total",
    "Partitions whose publish failed and was rescheduled with backoff.",
)
relay_publish_seconds = Histogram(
    "agentplatform_outbox_batch_publish_seconds", "Time to publish one claimed batch."
)
consumer_events = Counter(
    "agentplatform_consumer_events_total",
    "Events handled by in-app consumers.",
    ["consumer", "outcome"],
)
subscription_deliveries = Counter(
    "agentplatform_subscription_deliveries_total",
    "Outgoing HTTP subscription deliveries.",
    ["outcome"],
)
dead_letters = Counter(
    "agentplatform_dead_letters_total", "Jobs that became dead letters.", ["task"]
)
