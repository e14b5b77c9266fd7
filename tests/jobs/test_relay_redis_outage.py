"""The stream's Redis goes away mid-relay: events wait, then all arrive, none lost.

The relay is pointed at a redis-server of this test's own (the shared one serves
everyone else), which the test really stops and starts again.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from datetime import timedelta

import pytest
import redis
import time_machine
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from agentplatform import embedded
from jobs.models import OutboxEvent
from jobs.relay import outbox_drain, outbox_lag_seconds
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(embedded.valkey_server()),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def own_redis():
    server = RedisServer(_free_port())
    server.start()
    yield server
    server.stop()


def _record(task, run, n: int, start: int = 0) -> None:
    with transaction.atomic():
        events_record(
            task=task,
            run=run,
            events=[
                PendingEvent("agent.run.status.changed", {"from": "x", "to": "y", "i": start + i})
                for i in range(n)
            ],
        )


def test_events_stay_pending_while_redis_is_down_and_all_arrive_after(workspace, own_redis):
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    stream = f"test_h4.outage.{uuid.uuid4().hex}"
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    with override_settings(
        EVENT_STREAM_REDIS_URL=url, EVENT_STREAM_NAME=stream, EVENT_CONSUMERS=[]
    ):
        _record(task, run, 3)
        assert outbox_drain().published == 3

        own_redis.stop()
        _record(task, run, 4, start=3)
        report = outbox_drain()

        assert report.published == 0 and report.failed_partitions == 1
        pending = list(OutboxEvent.objects.filter(published_at__isnull=True).order_by("id"))
        assert len(pending) == 4
        head = pending[0]
        assert head.attempts == 1 and "Connection" in head.last_error
        assert head.available_at > timezone.now()
        assert outbox_lag_seconds() > 0

        own_redis.start()
        # Not before the backoff is over: the partition waits for its head.
        assert outbox_drain().published == 0
        with time_machine.travel(timezone.now() + timedelta(minutes=10)):
            assert outbox_drain().published == 4

    assert outbox_lag_seconds() == 0
    # The restarted server lost its data (no persistence): what matters is that every
    # pending event reached it, in order.
    entries = redis.Redis.from_url(url).xrange(stream)
    sequences = [json.loads(fields[b"event"])["sequence"] for _, fields in entries]
    assert sequences == [4, 5, 6, 7]
