"""Announce new timeline events on Redis pub/sub, so open streams wake at once.

The announcement is only a wake-up: it carries the run id and the last sequence number,
and a stream that receives it reads the events from the database. A lost announcement
delays a stream until its next keep-alive check; it never loses an event.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from django.conf import settings

# The channel the relay announces published events on: one name, built in one place.
from runs.timeline import run_announcement

logger = logging.getLogger("agentplatform.api")
_client_lock = threading.Lock()
_client: Any = None


def _redis() -> Any:
    global _client
    with _client_lock:
        if _client is None:
            import redis

            # Short timeouts: this runs in on_commit of request and step transactions,
            # and a stalled Redis must not stall them.
            _client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
            )
        return _client


def run_events_announce(*, run_id: uuid.UUID | str, sequence: int) -> None:
    """Publish ``{"run_id", "sequence"}`` on the run's channel; never raises."""
    try:
        _redis().publish(*run_announcement(run_id=run_id, sequence=sequence))
    except Exception:
        logger.warning("stream.announce_failed", exc_info=True)
