"""Relay throughput: batched partition claims against one-row-at-a-time claims.

Runs on a throwaway PostgreSQL database (``<DATABASE_TEST_NAME or test>_bench``) and the
Redis of REDIS_URL, with the in-app consumers switched off so the numbers are about the
relay itself (claim, XADD, mark). Prints events/s of both and their ratio.

    DATABASE_TEST_NAME=test_h4 REDIS_URL=redis://127.0.0.1:6379/4 \
        .venv/bin/python bench/bench_relay.py
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

RUNS, EVENTS_PER_RUN = int(os.environ.get("BENCH_RUNS", 40)), 50


def _fill() -> None:
    from runs.models import Run
    from runs.timeline import PendingEvent, events_record
    from tests.factories import TaskFactory, WorkspaceFactory

    workspace = WorkspaceFactory()
    pairs = []
    for _ in range(RUNS):
        task = TaskFactory(workspace=workspace)
        pairs.append((task, Run.objects.create(task=task, run_no=1)))
    for i in range(EVENTS_PER_RUN):
        for task, run in pairs:
            with transaction.atomic():
                events_record(
                    task=task,
                    run=run,
                    events=[
                        PendingEvent("agent.run.status.changed", {"from": "a", "to": "b", "i": i})
                    ],
                )


def _measure(limit: int, partitions: int) -> float:
    from jobs.models import OutboxEvent
    from jobs.relay import outbox_relay_batch

    OutboxEvent.objects.all().delete()
    _fill()
    total = RUNS * EVENTS_PER_RUN
    started = time.perf_counter()
    published = 0
    while published < total:
        report = outbox_relay_batch(limit=limit, partitions=partitions)
        if not report.claimed:
            break
        published += report.published
    return published / (time.perf_counter() - started)


def main() -> None:
    import redis

    base = settings.DATABASES["default"]["TEST"].get("NAME") or "test"
    settings.DATABASES["default"]["TEST"]["NAME"] = f"{base}_bench"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    stream = f"bench.relay.{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        with override_settings(EVENT_STREAM_NAME=stream, EVENT_CONSUMERS=[]):
            one = _measure(limit=1, partitions=1)
            batched = _measure(limit=50, partitions=50)
    finally:
        client.delete(stream, "events")
        connection.creation.destroy_test_db(old_name, verbosity=0)
    print(f"one event per claim (baseline): {one:8.0f} events/s")
    print(f"batched partition claims:       {batched:8.0f} events/s")
    print(f"ratio batched/baseline:         {batched / one:8.1f}x")


if __name__ == "__main__":
    main()
