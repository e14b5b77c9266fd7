"""Beat keeps its schedule across a restart of its broker (a Redis of the test's own)."""

from __future__ import annotations

import pytest
import redis
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tests.conftest import wait_for
from tests.test_beat_two_processes import Beat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE_QUEUE = "test_h11.beat_probe"


def test_beat_keeps_sending_after_its_redis_restarts(own_redis, monkeypatch, tmp_path):
    monkeypatch.setenv("CELERY_BROKER_URL", own_redis.url)
    PeriodicTask.objects.all().delete()
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.create(
        name="beat probe", task="runs.tasks_readmit", interval=every_second, queue=PROBE_QUEUE
    )
    client = redis.Redis.from_url(own_redis.url)
    beat = Beat("restart", tmp_path)
    try:
        wait_for(lambda: client.llen(PROBE_QUEUE) >= 2, timeout=40, message="first firings")
        own_redis.restart(down_seconds=2)
        assert client.llen(PROBE_QUEUE) == 0  # no persistence: the queue is gone
        wait_for(lambda: client.llen(PROBE_QUEUE) >= 2, timeout=40, message="firings after restart")
        assert beat.process.poll() is None
    finally:
        beat.stop()
