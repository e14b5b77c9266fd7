"""The outbox relay: publishes committed events, in order per partition, at least once."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.locks import sweep_lock
from jobs.logs import log
from jobs.models import OutboxEvent

BATCH_SIZE = 50


def relay_wake() -> None:
    """Ask a worker to publish pending events now (called on commit of new outbox rows)."""
    from jobs.tasks import outbox_relay

    try:
        outbox_relay.apply_async(queue="events")
    except Exception:  # the beat sweep publishes what this wake-up would have
        log.warning("relay.wake_failed", exc_info=True)


def _redis_client() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def stream_publish(rows: list[OutboxEvent]) -> None:
    """XADD each event to the external stream as CloudEvents JSON."""
    if settings.EMBEDDED and not getattr(settings, "EVENT_STREAM_ENABLED_EMBEDDED", False):
        return
    client = _redis_client()
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.xadd(
            settings.EVENT_STREAM_NAME,
            {"event": json.dumps(row.payload), "type": row.type, "partition": row.partition_key},
            maxlen=settings.EVENT_STREAM_MAXLEN,
            approximate=True,
        )
    pipe.execute()


def outbox_relay_batch(*, limit: int = BATCH_SIZE) -> int:
    """Publish one batch of pending events; returns how many were published.

    One relay at a time holds the publish lock, so events leave in id order, which is
    commit order within a partition.
    """
    with sweep_lock("outbox-relay") as held:
        if not held:
            return 0
        rows = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(published_at__isnull=True, available_at__lte=timezone.now())
            .order_by("id")[:limit]
        )
        if not rows:
            return 0
        try:
            stream_publish(rows)
        except Exception as exc:
            OutboxEvent.objects.filter(pk__in=[r.pk for r in rows]).update(
                attempts=F("attempts") + 1, last_error=str(exc)[:1000])
            log.warning("relay.publish_failed", error=str(exc), count=len(rows))
            return 0
        OutboxEvent.objects.filter(pk__in=[r.pk for r in rows]).update(
            published_at=timezone.now(), attempts=F("attempts") + 1)
    return len(rows)


def outbox_lag_seconds() -> float:
    """Age of the oldest pending event; 0 when the outbox is drained."""
    oldest = (
        OutboxEvent.objects.filter(published_at__isnull=True)
        .order_by("id").values_list("created_at", flat=True).first()
    )
    return (timezone.now() - oldest).total_seconds() if oldest else 0.0


__all__ = ["outbox_lag_seconds", "outbox_relay_batch", "relay_wake", "transaction"]
