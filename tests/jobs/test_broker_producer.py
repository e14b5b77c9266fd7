"""The platform's wake-ups reach a Redis broker as kombu would have written them.

``task_producer`` writes the list entry itself instead of going through kombu's producer,
and ``task_send`` builds the message without ``apply_async``'s per-call work; a worker
must not be able to tell. Each test publishes the same task both ways to a Redis of its
own and compares what lands in the queue's list, then consumes it with kombu's own Redis
channel.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from celery import signals
from celery._state import _task_stack
from kombu import Connection

from agentplatform.celery import app
from jobs import tracing
from jobs.producer import task_producer, task_send
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


def _read_back(url: str, queue_name: str, args: tuple[Any, ...]) -> None:
    """kombu's own Redis channel reads the queue's two run messages: the task, its
    arguments, acknowledgeable."""
    with Connection(url) as connection:
        queue = connection.SimpleQueue(queue_name)
        for _ in range(2):
            message = queue.get(timeout=5)
            assert message.headers["task"] == "runs.step"
            assert message.payload[0] == list(args)
            message.ack()
        queue.close()


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
    _read_back(own_redis.url, "agent", args)


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


def test_task_send_writes_the_message_apply_async_writes(own_redis, broker_at) -> None:
    broker_at(own_redis.url)
    args = (str(uuid.uuid4()), 7)
    heard: list[tuple[str, dict[str, Any]]] = []

    def before(sender: str = "", headers: Any = None, **kwargs: Any) -> None:
        heard.append(("before", {"sender": sender, "routing_key": kwargs["routing_key"]}))

    def after(sender: str = "", headers: Any = None, **kwargs: Any) -> None:
        heard.append(("after", {"sender": sender, "routing_key": kwargs["routing_key"]}))

    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    try:
        with tracing.trace_scope(tracing.traceparent_new()):
            for queue in ("agent", "verify"):
                run_step.apply_async(args=args, queue=queue)  # kombu's producer
                sent = task_send(run_step, args, queue=queue)
                celerys, ours = _entries(own_redis.url, queue)
                assert _without_ids(ours) == _without_ids(celerys)
                assert ours["headers"]["id"] == sent == ours["properties"]["correlation_id"]
                assert ours["headers"]["root_id"] == sent
                assert ours["headers"]["traceparent"] != celerys["headers"]["traceparent"]
        # The relay's wake-up (no arguments, a task of its own options) alike.
        outbox_relay.apply_async(queue="relay")
        task_send(outbox_relay, (), queue="relay")
        celerys, ours = _entries(own_redis.url, "relay")
        assert _without_ids(ours) == _without_ids(celerys)
        assert ours["headers"]["task"] == "jobs.outbox_relay"
    finally:
        signals.before_task_publish.disconnect(before)
        signals.after_task_publish.disconnect(after)
    # Both ways told the publish signals the same, before and after each message.
    expected = [
        (moment, {"sender": sender, "routing_key": queue})
        for sender, queue in (
            ("runs.step", "agent"),
            ("runs.step", "verify"),
            ("jobs.outbox_relay", "relay"),
        )
        for _ in range(2)
        for moment in ("before", "after")
    ]
    assert heard == expected

    _read_back(own_redis.url, "verify", args)


def test_task_send_inside_a_task_leaves_it_to_apply_async(own_redis, broker_at) -> None:
    """A message sent from a running task carries that task's ids (its parent and root)
    and joins its trail: apply_async's own work, so task_send hands it over."""
    broker_at(own_redis.url)
    parent_id, root_id = str(uuid.uuid4()), str(uuid.uuid4())
    run_step.push_request(id=parent_id, root_id=root_id, called_directly=False)
    _task_stack.push(run_step)
    try:
        task_send(run_step, ("r", 1), queue="agent")
        run_step.apply_async(args=("r", 1), queue="agent", argsrepr=repr(("r", 1)), kwargsrepr="{}")
    finally:
        _task_stack.pop()
        run_step.pop_request()
    ours, celerys = _entries(own_redis.url, "agent")
    assert ours["headers"]["parent_id"] == parent_id
    assert ours["headers"]["root_id"] == root_id
    assert _without_ids(ours) == _without_ids(celerys)


def test_task_send_leaves_options_it_does_not_carry_to_apply_async(own_redis, broker_at) -> None:
    """A task with a priority of its own: apply_async writes it (to kombu's priority list
    of the queue), not the plain list entry."""
    broker_at(own_redis.url)

    @app.task(name="tests.broker_producer.prioritised", priority=6, shared=False)
    def prioritised(value: str) -> None: ...

    task_send(prioritised, ("p",), queue="agent")
    client = redis.Redis.from_url(own_redis.url)
    assert client.llen("agent") == 0
    assert [key for key in client.keys("agent*") if key.startswith(b"agent\x06\x16")]
    with pytest.raises(TypeError):  # the task's signature is checked, as apply_async does
        task_send(run_step, ("only one",), queue="agent")
