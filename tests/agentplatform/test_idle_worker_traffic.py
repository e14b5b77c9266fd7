"""An idle worker publishes nothing on the broker, and remote control still reaches it.

Celery's default consumer has every worker publish a heartbeat event every 2 s, receive
every other worker's (gossip) and ask all of them for their revoked tasks at start-up
(mingle): most of an idle worker's CPU, growing with the square of the workers. Workers
are started with ``--without-heartbeat --without-gossip --without-mingle``; here a real
worker started so (tests.conftest.WorkerProcess) is watched on the broker's event
channels from before it starts.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import redis
from django.conf import settings

from agentplatform.celery import app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_idle_worker_sends_no_events_and_answers_a_ping(start_worker: Any) -> None:
    watcher = redis.Redis.from_url(settings.CELERY_BROKER_URL).pubsub()
    watcher.psubscribe("*celeryev*")  # kombu's fanout channel for the "celeryev" exchange
    try:
        worker = start_worker("quiet", concurrency=1)
        time.sleep(3)  # past one heartbeat interval (2 s)
        # WorkerProcess names its worker "<name>-<pid of this process>@<host>".
        name = f"{worker.name}-{os.getpid()}@{socket.gethostname()}"
        replies = app.control.ping(destination=[name], timeout=5)
        events = []
        while (message := watcher.get_message(timeout=0.2)) is not None:
            if message["type"] == "pmessage":
                events.append(message["data"][:200])
    finally:
        watcher.close()

    assert replies, "the worker did not answer a ping"
    assert events == []
    assert "mingle" not in worker.output()
