"""Each benchmark figure starts from an empty broker and no work left by the figures
before it (the idle figure used to measure the web figures' backlog)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from bench.harness import Bench
from jobs.models import OutboxEvent, WorkItem
from runs.models import Run, Task
from tests.factories import OutboxEventFactory, RunFactory, TaskFactory

pytestmark = pytest.mark.django_db

LEFT_IN_BROKER = ("relay", "events", "agent\x06\x166", "webhooks", "unacked")


@pytest.fixture
def broker() -> Any:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(*LEFT_IN_BROKER)
    yield client
    client.delete(*LEFT_IN_BROKER)


def _bench(broker: Any) -> Bench:
    # The harness's state without its set-up (no database re-created, no processes).
    bench = Bench.__new__(Bench)
    bench.own_redis = False
    bench.broker = bench.redis = broker
    return bench


def test_what_a_figure_leaves_is_done_and_the_broker_empty_before_the_next(broker) -> None:
    OutboxEventFactory.create_batch(3)
    WorkItem.objects.create(kind="webhook", key="1", queue="webhooks", due_at=timezone.now())
    RunFactory(status=Run.Status.RUNNING, lease_owner="w", lease_until=timezone.now())
    TaskFactory(status=Task.Status.DEFERRED)
    for key in LEFT_IN_BROKER[:-1]:
        broker.rpush(key, b"message")
    broker.hset("unacked", "tag", b"message")

    _bench(broker).quiesce()

    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert not WorkItem.objects.filter(status=WorkItem.Status.PENDING).exists()
    assert not Run.objects.exclude(status__in=["completed", "failed", "cancelled", "timed_out"])
    assert not Task.objects.filter(status=Task.Status.DEFERRED).exists()
    assert broker.exists(*LEFT_IN_BROKER) == 0


@pytest.mark.django_db(transaction=True)
def test_each_figure_starts_on_a_vacuumed_and_analysed_database(broker) -> None:
    """As autovacuum would have left it (it is off on machines like the bench's): the
    dead rows of the figures before are gone and the planner knows the tables' sizes."""
    from django.db import connection

    RunFactory.create_batch(5, status=Run.Status.RUNNING)
    Run.objects.update(status=Run.Status.CANCELLED)  # five dead versions

    def table() -> tuple[float, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.reltuples, pg_stat_get_vacuum_count(c.oid)"
                " FROM pg_class c WHERE c.oid = %s::regclass",
                [Run._meta.db_table],
            )
            reltuples, vacuums = cursor.fetchone()
        return reltuples, vacuums

    _, vacuums_before = table()

    _bench(broker).database_settle()

    reltuples, vacuums_after = table()
    assert reltuples == 5  # analysed: -1 until a table is first analysed or vacuumed
    assert vacuums_after == vacuums_before + 1
