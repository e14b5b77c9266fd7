"""The platform's wake-ups reach a Redis broker as kombu would have written them.

``task_producer`` writes the list entry itself instead of going through kombu's producer;
a worker must not be able to tell. Each test publishes the same task both ways to a
Redis of its own and compares what lands in the queue's list, then consumes it with
kombu's own Redis channel.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection

from agentplatform.celery import app
from jobs.producer import task_producer
from jobs.tasks import outbox_relay
from runs.tasks import run_step

pytestmark = pytest.mark.services

# What differs between two messages of the same task by design: its ids and the tag.
_IDS = ("id", "root_id", "correlation_id", "delivery_tag")


def _entries(url: str, queue: str) -> list[dict[str, Any]]:
    raw = redis.Redis.from_url(url).lrange(queue, 0, -1)
    return [json.loads(entry) for entry in reversed(raw)]  # LPUSH: newest first


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    message = json.loads(json.dumps(message))
    for part in (message["headers"], message["properties"]):
        for key in _IDS:
            part.pop(key, None)
    parent = message["headers"].get("traceparent")
    if parent:  # a trace active in the process: each message is a span of its own
        message["headers"]["traceparent"] = parent.split("-")[1]  # the trace id
    return message


def test_a_wake_up_is_the_message_kombu_writes(own_redis, broker_at) -> None:
    broker_at(own_redis.url)
    producer = task_producer(app)
    assert producer is not None
    args = (str(uuid.uuid4()), 4)
    options = {"queue": "agent", "argsrepr": repr(args), "kwargsrepr": "{}"}
    run_step.apply_async(args=args, **options)
    run_step.apply_async(args=args, producer=producer, **options)
    outbox_relay.apply_async(queue="relay", countdown=30)
    outbox_relay.apply_async(queue="relay", countdown=30, producer=producer)

    kombus, ours = _entries(own_redis.url, "agent")
    assert _without_ids(ours) == _without_ids(kombus)
    assert ours["headers"]["id"] != kombus["headers"]["id"]
    assert ours["properties"]["correlation_id"] == ours["headers"]["id"]
    relay_kombu, relay_ours = _entries(own_redis.url, "relay")
    assert relay_ours["headers"]["eta"]  # the countdown travels as Celery's header
    relay_ours["headers"]["eta"] = relay_kombu["headers"]["eta"]
    assert _without_ids(relay_ours) == _without_ids(relay_kombu)

    # kombu's own channel reads it back: the task, its arguments, acknowledgeable.
    with Connection(own_redis.url) as connection:
        queue = connection.SimpleQueue("agent")
        for _ in range(2):
            message = queue.get(timeout=5)
            assert message.headers["task"] == "runs.step"
            assert message.payload[0] == list(args)
            message.ack()
        queue.close()


def test_what_it_does_not_write_itself_goes_through_kombu(own_redis, broker_at) -> None:
    broker_at(own_redis.url)
    producer = task_producer(app)
    assert producer is not None
    # A priority puts the message on kombu's priority list of the queue.
    run_step.apply_async(args=("x", 1), queue="agent", priority=6, producer=producer)
    client = redis.Redis.from_url(own_redis.url)
    assert client.llen("agent") == 0
    assert [key for key in client.keys("agent*") if key.startswith(b"agent\x06\x16")]

    # Redis refusing the producer's own command: kombu publishes it, with its retries.
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    producer.client, alive = dead, producer.client
    try:
        run_step.apply_async(args=("y", 2), queue="agent", producer=producer)
    finally:
        producer.client = alive
    (entry,) = _entries(own_redis.url, "agent")
    assert entry["headers"]["argsrepr"] == repr(("y", 2))


def test_another_broker_keeps_celerys_producer(broker_at) -> None:
    broker_at("amqp://guest:guest@127.0.0.1:5672//")
    assert task_producer(app) is None
