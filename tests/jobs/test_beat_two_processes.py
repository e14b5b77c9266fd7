"""Two beat processes: only the leader fires; when it dies, the other takes over."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tests.conftest import beat_start, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE_QUEUE = "test_h4.beat_probe"  # no worker listens: the queue counts the firings
SENT = b"Sending due task beat probe"


class Beat:
    def __init__(self, name: str, log_dir: Path) -> None:
        self.log_path = log_dir / f"beat-{name}.log"
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = beat_start(log_dir / f"beat-{name}.db", self.log)

    def sends(self) -> int:
        return self.log_path.read_bytes().count(SENT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        self.kill()
        self.log.close()


def test_two_beats_fire_each_schedule_once_and_fail_over(tmp_path):
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(PROBE_QUEUE)
    PeriodicTask.objects.all().delete()
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.create(
        name="beat probe", task="runs.tasks_readmit", interval=every_second, queue=PROBE_QUEUE
    )
    beats = [Beat("a", tmp_path), Beat("b", tmp_path)]
    try:
        wait_for(
            lambda: sum(b.sends() for b in beats) >= 4,
            timeout=40,
            interval=0.2,
            message="four firings",
        )
        time.sleep(2)
        sends = [b.sends() for b in beats]
        assert min(sends) == 0, f"both beats fired: {sends}"
        # The log line comes just before the publish: let the queue catch up, then no
        # message may exist that no log line announced.
        wait_for(lambda: client.llen(PROBE_QUEUE) >= sum(sends), timeout=5, message="publish")
        assert client.llen(PROBE_QUEUE) <= sum(b.sends() for b in beats)

        leader = beats[sends.index(max(sends))]
        follower = beats[1 - beats.index(leader)]
        leader.kill()
        wait_for(
            lambda: follower.sends() >= 2,
            timeout=30,
            interval=0.2,
            message="the follower to take over",
        )
    finally:
        for beat in beats:
            beat.stop()
        client.delete(PROBE_QUEUE)
