"""Processing: map a recorded delivery to orchestrator commands, exactly once.

A receipt is processed under its row lock in one transaction with every command it
causes and the semantic keys that guard them, so a duplicated message waits and then
finds the receipt done, and a crash leaves nothing half-applied. Each provider's
handlers (``webhooks.github``, ``webhooks.gitlab``) map a delivery to commands
(``webhooks.mapping``), which go through ``runs.services``: processing never sets a
run's or a task's status.
"""

from __future__ import annotations

import time
import traceback

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import tracing
from runs.models import Repository
from webhooks import metrics
from webhooks.github import GITHUB_HANDLERS
from webhooks.gitlab import GITLAB_HANDLERS
from webhooks.intake import GITHUB
from webhooks.logs import log
from webhooks.mapping import Delivery, Outcome
from webhooks.models import WebhookReceipt


def _repositories(receipt: WebhookReceipt) -> list[Repository]:
    """The repositories whose own secret verified the delivery (docs/design.md §9: a delivery
    reaches only repositories that proved they own it); a receipt naming none, as one
    recorded before routing required that proof, reaches nobody."""
    if not receipt.repository_ids:
        return []
    rows = Repository.objects.filter(pk__in=receipt.repository_ids)
    return list(rows.select_related("workspace").order_by("pk"))


def webhook_route(*, receipt: WebhookReceipt) -> Outcome:
    """The outcome of one delivery's commands; runs inside the caller's transaction."""
    delivery = Delivery(receipt=receipt, repositories=_repositories(receipt))
    if receipt.provider == GITHUB:
        handler = GITHUB_HANDLERS.get(receipt.event)
    else:
        handler = GITLAB_HANDLERS.get(str(receipt.payload.get("object_kind") or ""))
    if handler is None:
        return Outcome.ignored(f"event {receipt.event!r} is recorded, not handled")
    return handler(delivery)


def webhook_receipt_process(*, receipt_id: int) -> str:
    """Process a receipt once: a processed or ignored receipt is left alone.

    The receipt row stays locked for the whole transaction, so a duplicated message
    waits and then finds it done. On error everything rolls back, the receipt is marked
    failed with the error and the exception propagates for the task to retry.
    """
    started = time.monotonic()
    try:
        with transaction.atomic():
            receipt = WebhookReceipt.objects.select_for_update().filter(pk=receipt_id).first()
            if receipt is None:
                return "missing"
            if receipt.status in (WebhookReceipt.Status.PROCESSED, WebhookReceipt.Status.IGNORED):
                return receipt.status
            tracing.trace_activate((receipt.headers or {}).get("traceparent"))
            outcome = webhook_route(receipt=receipt)
            now = timezone.now()
            WebhookReceipt.objects.filter(pk=receipt_id).update(
                status=outcome.status,
                status_reason=outcome.reason[:500],
                error="",
                attempts=F("attempts") + 1,
                last_attempt_at=now,
                processed_at=now,
                processing_ms=int((time.monotonic() - started) * 1000),
            )
    except Exception as exc:
        WebhookReceipt.objects.filter(pk=receipt_id).update(
            status=WebhookReceipt.Status.FAILED,
            error=traceback.format_exc()[-10000:],
            status_reason=f"{type(exc).__name__}: {exc}"[:500],
            attempts=F("attempts") + 1,
            last_attempt_at=timezone.now(),
            processing_ms=int((time.monotonic() - started) * 1000),
        )
        provider = (
            WebhookReceipt.objects.filter(pk=receipt_id).values_list("provider", flat=True).first()
            or "unknown"
        )
        metrics.processed.labels(provider=provider, status="failed").inc()
        log.error("webhook.process_failed", receipt_id=receipt_id, error=str(exc)[:300])
        raise
    elapsed = time.monotonic() - started
    metrics.processed.labels(provider=receipt.provider, status=outcome.status).inc()
    metrics.processing_seconds.labels(provider=receipt.provider).observe(elapsed)
    log.info(
        "webhook.processed",
        receipt_id=receipt_id,
        webhook_event=receipt.event,
        action=receipt.action,
        status=outcome.status,
        reason=outcome.reason[:200],
    )
    return outcome.status
