"""Outgoing HTTP subscriptions: POST each event to the workspace's endpoint, signed.

The body is the structured CloudEvent (``application/cloudevents+json``). Signing
follows GitHub's webhooks so receivers can reuse their verification code:
``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body with the secret>``.
``X-Agentplatform-Delivery`` is the event id: the receiver's idempotency key, since a
delivery is retried until a 2xx arrives (at least once).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction

from jobs import metrics, tracing
from jobs.consumers import PermanentConsumerError, processed_claim
from jobs.models import EventSubscription, OutboxEvent, ProcessedEvent


class DeliveryFailed(Exception):
    """The endpoint did not accept the delivery (network error or non-2xx); retry."""


def signature_for(*, secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_verify(*, secret: str, body: bytes, header: str) -> bool:
    """Constant-time check of an X-Hub-Signature-256 header (for receivers and tests)."""
    return hmac.compare_digest(signature_for(secret=secret, body=body), header or "")


def consumer_name(subscription_id: int) -> str:
    return f"subscription:{subscription_id}"


def subscription_deliver(
    *, subscription_id: int, event_id: str, payload: dict[str, Any] | None = None
) -> str:
    """POST the event to the subscription once it is accepted; delivered, duplicate, gone.

    ``payload`` is the envelope when the caller has it (a re-delivery from history whose
    outbox row is pruned); otherwise it is read from the outbox.
    """
    name = consumer_name(subscription_id)
    if ProcessedEvent.objects.filter(consumer=name, event_id=event_id).exists():
        return "duplicate"
    sub = EventSubscription.objects.filter(pk=subscription_id, active=True).first()
    if payload is None:
        payload = (
            OutboxEvent.objects.filter(event_id=event_id).values_list("payload", flat=True).first()
        )
    if sub is None or payload is None:
        return "gone"
    tracing.event_bind(payload)
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/cloudevents+json",
        "User-Agent": "agentplatform-hookshot",
        "X-Hub-Signature-256": signature_for(secret=sub.secret, body=body),
        "X-Agentplatform-Event": str(payload.get("type", "")),
        "X-Agentplatform-Delivery": event_id,
    }
    # The subscriber joins the event's trace (W3C Trace Context over HTTP).
    hop = tracing.traceparent_child(tracing.traceparent_current() or payload.get("traceparent"))
    if hop:
        headers["traceparent"] = hop
    try:
        response = httpx.post(
            sub.url, content=body, headers=headers, timeout=settings.SUBSCRIPTION_TIMEOUT_SECONDS
        )
    except httpx.HTTPError as exc:
        metrics.subscription_deliveries.labels("failed").inc()
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if not response.is_success:
        metrics.subscription_deliveries.labels("failed").inc()
        if response.status_code in (400, 404, 410, 413, 422):
            # The receiver says it will never take this delivery: stop retrying.
            raise PermanentConsumerError(f"endpoint answered {response.status_code}")
        raise DeliveryFailed(f"endpoint answered {response.status_code}")
    with transaction.atomic():
        processed_claim(consumer=name, event_id=event_id)
    metrics.subscription_deliveries.labels("delivered").inc()
    return "delivered"
