"""Worker liveness: each Celery worker records a heartbeat row; readers ask who is alive.

The worker's main process starts ``WorkerHeartbeater`` once it is ready (Celery's
``worker_ready`` signal) and says goodbye at shutdown. A killed worker says nothing:
its heartbeat simply stops, and after ``WORKER_HEARTBEAT_SECONDS * 3`` it is not alive.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from jobs.logs import log
from jobs.models import WorkerHeartbeat

# The queues this process's worker consumes (set when a worker starts); empty elsewhere.
_queues_served: frozenset[str] = frozenset()


def queues_served_set(names: Iterable[str]) -> None:
    """Record the queues this process's worker consumes (``agentplatform.celery``)."""
    global _queues_served
    _queues_served = frozenset(names)


def queues_served() -> frozenset[str]:
    """The queues this process's worker consumes; empty outside a worker."""
    return _queues_served


def worker_heartbeat_record(
    *, name: str, hostname: str, pid: int, queues: list[str], concurrency: int, started_at: datetime
) -> None:
    """Upsert the worker's row with a fresh heartbeat: one UPDATE once the row exists."""
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": sorted(queues),
        "concurrency": concurrency,
        "started_at": started_at,
        "last_heartbeat_at": timezone.now(),
        "stopped_at": None,
    }
    if not WorkerHeartbeat.objects.filter(name=name).update(**fields):
        WorkerHeartbeat.objects.update_or_create(name=name, defaults=fields)


def worker_stopped_record(*, name: str) -> None:
    WorkerHeartbeat.objects.filter(name=name).update(stopped_at=timezone.now())


def worker_alive_cutoff(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=3 * settings.WORKER_HEARTBEAT_SECONDS)


def workers_listed(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every known worker, newest heartbeat first, with whether it is alive."""
    cutoff = worker_alive_cutoff(now)
    rows = []
    for worker in WorkerHeartbeat.objects.order_by("-last_heartbeat_at")[:500]:
        alive = worker.stopped_at is None and worker.last_heartbeat_at >= cutoff
        rows.append({"worker": worker, "alive": alive})
    return rows


def queues_without_live_worker(*, queues: list[str], now: datetime | None = None) -> list[str]:
    """Of ``queues``, those that no live worker consumes."""
    served: set[str] = set()
    for names in WorkerHeartbeat.objects.filter(
        stopped_at__isnull=True, last_heartbeat_at__gte=worker_alive_cutoff(now)
    ).values_list("queues", flat=True):
        served.update(names or [])
    return [name for name in queues if name not in served]


class WorkerHeartbeater:
    """Records this worker's heartbeat every ``WORKER_HEARTBEAT_SECONDS`` from a thread."""

    def __init__(self, *, name: str, queues: list[str], concurrency: int) -> None:
        self.name = name
        self.queues = queues
        self.concurrency = concurrency
        self.started_at = timezone.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        """One heartbeat on this thread's own persistent connection.

        The connection is kept between beats (a new one every beat was 6 PostgreSQL
        connections per idle minute and worker). Django's rules retire it: past
        ``CONN_MAX_AGE``, or unusable after an error (checked before the next use). It
        is safe across the pool's forks: it belongs to this thread, which a forked pool
        process does not have, and psycopg never closes a connection inherited by
        another process (Celery closes the pool process's own ones).
        """
        try:
            close_old_connections()
            worker_heartbeat_record(
                name=self.name,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                queues=self.queues,
                concurrency=self.concurrency,
                started_at=self.started_at,
            )
        except Exception:  # the next beat tries again; the database may be restarting
            log.warning("worker.heartbeat_failed", worker=self.name, exc_info=True)
            # A connection that failed mid-beat is not trusted again.
            connection.close()

    def _loop(self) -> None:
        try:
            self._beat()
            while not self._stop.wait(settings.WORKER_HEARTBEAT_SECONDS):
                self._beat()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            worker_stopped_record(name=self.name)
        except Exception:
            log.warning("worker.goodbye_failed", worker=self.name, exc_info=True)
        finally:
            connection.close()
