"""Prometheus metrics of runs, read from the database when scraped."""

from __future__ import annotations

from prometheus_client import Gauge


def _oldest_lease() -> float:
    from runs.reaper import oldest_lease_age_seconds

    try:
        return oldest_lease_age_seconds()
    except Exception:  # a scrape must not fail because the database blinked
        return float("nan")


oldest_lease_age = Gauge(
    "agentplatform_oldest_active_lease_age_seconds",
    "Seconds since the last heartbeat of the oldest lease held by an active run.",
)
oldest_lease_age.set_function(_oldest_lease)
