"""The broker transport: kombu's Redis transport, surviving Redis's own restart.

It is kombu's, with one change for the moment Redis goes away: see ``DetachedSafeQoS``.
"""

from __future__ import annotations

from typing import Any

import structlog
from kombu.transport import TRANSPORT_ALIASES, redis
from redis.exceptions import ConnectionError as RedisConnectionError


def _detached(channel: Any) -> bool:
    return channel.connection is None or channel.connection.client is None


class DetachedSafeQoS(redis.QoS):
    """Unacknowledged messages of a channel whose connection is gone stay where they are.

    Closing a channel pushes its unacknowledged messages back to their queues. After
    Celery collected a broken connection there is nothing to push them through; they are
    still in Redis's unacked index (if Redis kept them), ``restore_visible`` puts them back
    after the visibility timeout, and the work they would wake is in the database, whose
    sweeps re-send it long before that.
    """

    def restore_unacked(self, client: Any = None) -> None:
        if client is None and _detached(self.channel):
            delivered = self._delivered
            structlog.get_logger("agentplatform.broker").warning(
                "broker.unacked_left_in_redis", messages=len(delivered or ())
            )
            if delivered:
                delivered.clear()
            return
        super().restore_unacked(client)


class DetachedSafeRedisChannel(redis.Channel):
    """A channel that reports a lost connection as a connection error, never AttributeError.

    When Redis drops, Celery collects the broken connection, which detaches its transport
    and channels, and then closes the consumers' channels and acknowledges tasks that
    finished meanwhile. kombu's channel builds a new connection pool from the detached
    transport for those and raises AttributeError, which the worker treats as
    unrecoverable: it exits. A connection error is what Celery expects from a broker that
    went away: it logs it and reconnects.
    """

    QoS = DetachedSafeQoS

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if _detached(self):
            raise RedisConnectionError("the channel's broker connection is closed")
        return super()._connparams(asynchronous)  # type: ignore[misc]


class RedisTransport(redis.Transport):
    """kombu's Redis transport whose channels fail like a lost connection once detached."""

    Channel = DetachedSafeRedisChannel


# Every redis:// and rediss:// broker URL of the platform gets the transport above; the
# URL, and what Celery logs of it, stay as the operator wrote them.
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = "agentplatform.broker:RedisTransport"
