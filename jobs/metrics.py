"""Prometheus metrics of delivery, and the store every process's metrics are written to.

Counters and histograms use prometheus-client's multiprocess mode: each process writes
its values to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` (default
``var/metrics``), and a scrape of any web process sums the files of all processes of the
deployment on that host. The directory must be emptied before the deployment's processes
start (``manage.py serve`` does; under systemd, ``ExecStartPre``). Every module that
defines metrics imports this one first.

The state gauges (outbox lag and backlog, queue depth, open dead letters, oldest lease,
active runs) are computed at scrape time by ``agentplatform.metrics_endpoint``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client import Counter, Histogram, values


def multiprocess_dir() -> Path:
    """The deployment's metrics directory (PROMETHEUS_MULTIPROC_DIR, else var/metrics)."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not configured:
        from django.conf import settings

        configured = str(settings.METRICS_DIR)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = configured
    path = Path(configured)
    path.mkdir(parents=True, exist_ok=True)
    return path


def multiprocess_dir_reset() -> Path:
    """Empty the directory before a deployment's processes start (dead processes' files)."""
    path = multiprocess_dir()
    for child in path.iterdir():
        if child.is_file() and child.suffix == ".db":
            child.unlink(missing_ok=True)
        elif child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
    return path


# prometheus-client picks its value store when first imported; whatever imported it first,
# every metric defined from here on is written to the shared directory.
multiprocess_dir()
if values.ValueClass.__name__ != "MmapedValue":
    values.ValueClass = values.MultiProcessValue()

events_published = Counter(
    "agent_outbox_events_published", "Outbox events published to every sink."
)
publish_failures = Counter(
    "agent_outbox_publish_failures",
    "Partitions whose publish failed and was rescheduled with backoff.",
)
relay_publish_seconds = Histogram(
    "agent_outbox_batch_publish_seconds", "Time to publish one claimed batch."
)
consumer_events = Counter(
    "agent_consumer_events",
    "Events handled by in-app consumers.",
    ["consumer", "outcome"],
)
subscription_deliveries = Counter(
    "agent_subscription_deliveries",
    "Outgoing HTTP subscription deliveries.",
    ["outcome"],
)
dead_letters = Counter("agent_dead_letters", "Jobs that became dead letters.", ["task"])
