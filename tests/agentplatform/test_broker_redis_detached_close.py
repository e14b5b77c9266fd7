"""A worker's channels close cleanly after Redis went away, unacknowledged messages or not.

When Redis drops, Celery collects the broken connection and then closes the consumers'
channels. With kombu's stock transport, a channel still holding an unacknowledged message
raised AttributeError ('NoneType' object has no attribute 'hostname') on close, and the
worker exited with "Unrecoverable error".
"""

from __future__ import annotations

import contextlib

import pytest
from django.conf import settings
from kombu import Connection

from agentplatform.broker import RedisTransport
from agentplatform.celery import app

pytestmark = pytest.mark.services


def _channels_holding_unacked_messages(connection: Connection, names: list[str]) -> list:
    channels = []
    for name in names:
        connection.SimpleQueue(name).put({"queue": name})
        channel = connection.channel()
        channel.queue_declare(name)
        message = channel.basic_get(name, no_ack=False)
        assert message is not None
        channels.append(channel)
    return channels


@pytest.mark.parametrize(
    ("transport", "survives"),
    [("kombu.transport.redis:Transport", False), ("redis", True)],
    ids=["kombu-stock", "platform"],
)
def test_closing_channels_after_redis_died_does_not_raise(own_redis, transport, survives):
    connection = Connection(own_redis.url, transport=transport)
    channels = _channels_holding_unacked_messages(connection, ["first", "second"])

    own_redis.stop()
    # What Celery's consumer does on a lost broker connection: collect it, then close
    # what is left. Collecting detaches the transport from the connection.
    with contextlib.suppress(Exception):  # Celery ignores errors here too
        connection.collect(socket_timeout=1)
    errors = []
    for channel in channels:
        try:
            channel.close()
        except AttributeError as exc:
            errors.append(exc)

    if survives:
        assert errors == []
    else:
        # The stock transport still fails this way; if it stops doing so, the subclass
        # can go.
        assert errors and "hostname" in str(errors[0])


@pytest.mark.parametrize(
    ("transport", "survives"),
    [("kombu.transport.redis:Transport", False), ("redis", True)],
    ids=["kombu-stock", "platform"],
)
def test_acknowledging_after_redis_died_is_a_connection_error(own_redis, transport, survives):
    """A task that finishes after its worker collected the broken connection acks late.

    On kombu's stock channel this ack built a pool from the detached transport and raised
    AttributeError ('NoneType' object has no attribute 'client'); the worker exited.
    """
    connection = Connection(own_redis.url, transport=transport)
    connection.SimpleQueue("work").put({"run": 1})
    channel = connection.channel()
    channel.queue_declare("work")
    message = channel.basic_get("work", no_ack=False)
    assert message is not None

    own_redis.stop()
    with contextlib.suppress(Exception):  # Celery ignores errors here too
        connection.collect(socket_timeout=1)
    with contextlib.suppress(Exception):  # its restore may fail: Redis is down
        channel.close()
    channel._disconnect_pools()  # the state the worker was in: no pool left to reuse

    expected = connection.connection_errors if survives else AttributeError
    # Celery logs a connection error on ack and carries on; AttributeError ends the worker.
    with pytest.raises(expected):
        message.ack()


def test_workers_and_producers_use_the_transport_that_survives():
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, RedisTransport)
        # What the worker logs on connecting names the URL the operator configured.
        assert connection.as_uri().startswith("redis://")
