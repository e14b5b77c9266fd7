"""The Redis client of the wake-up keys that coalesce the relay's and the work drains'
wake-ups (``jobs.relay``, ``jobs.work``)."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

_clients: dict[str, Any] = {}


def coalescing_client() -> Any:
    """The Redis holding the wake-up keys, one connection pool per URL and process."""
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        _clients[url] = client
    return client
