"""Prometheus metrics of delivery, and the store every process's metrics are written to.

Counters and histograms use prometheus-client's multiprocess mode: each process writes
its values to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` (default
``var/metrics``), and a scrape of any web process sums the files of all processes of the
deployment on that host. Files of processes that are gone are removed when a deployment
starts (``manage.py serve`` does; under systemd, ``ExecStartPre``). Every module that
defines metrics imports this one first.

The state gauges (outbox lag and backlog, queue depth, open dead letters, oldest lease,
active runs) are computed at scrape time by ``agentplatform.metrics_endpoint``.
"""

from __future__ import annotations

import os
import re
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def multiprocess_dir_reset() -> Path:
    """Remove the files of processes that are gone, before a deployment's processes start.

    Files of live processes stay: a second deployment step (or a test's server) sharing
    the directory must not wipe the counters of processes still writing them.
    """
    path = multiprocess_dir()
    for child in path.iterdir():
        found = re.search(r"_(\d+)\.db$", child.name)
        if child.is_file() and found and not _alive(int(found.group(1))):
            child.unlink(missing_ok=True)
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
retention_deleted = Counter(
    "agent_retention_deleted_rows",
    "Rows deleted by the retention sweep, by retention (jobs.retention).",
    ["retention"],
)
