"""Publishing reuses one Redis client per channel pool instead of building one per message,
and still delivers every message; a new pool (after a fork or reconnect) gets a new client."""

from __future__ import annotations

import pytest
from kombu import Connection

pytestmark = pytest.mark.services


def test_publishes_share_one_client_of_the_channels_pool(own_redis) -> None:
    connection = Connection(own_redis.url, transport="redis")
    channel = connection.channel()
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.connection_pool is channel.pool
    given = object()
    with channel.conn_or_acquire(given) as client:
        assert client is given

    channel._disconnect_pools()  # what a fork or a reconnect does
    with channel.conn_or_acquire() as renewed:
        assert renewed is not first
        assert renewed.connection_pool is channel.pool


def test_every_published_message_arrives_in_order(own_redis) -> None:
    connection = Connection(own_redis.url, transport="redis")
    queue = connection.SimpleQueue("wake")
    for n in range(5):
        queue.put({"n": n})
    received = []
    for _ in range(5):
        message = queue.get(timeout=5)
        received.append(message.payload["n"])
        message.ack()
    assert received == [0, 1, 2, 3, 4]
    connection.release()
