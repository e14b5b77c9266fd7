"""Operator use cases on webhook receipts."""

from __future__ import annotations

from django.db import transaction

from webhooks.intake import receipt_dispatch
from webhooks.logs import log
from webhooks.models import WebhookReceipt


def webhook_receipt_reprocess(*, receipt: WebhookReceipt, by: str = "") -> bool:
    """Send a receipt to processing again; False if it is already waiting for it.

    Safe for any receipt, processed ones included: every command processing issues is
    guarded by a semantic key or an idempotency key, so a replay only acts where the
    first attempt did not (a failure, or a repository mapped since).
    """
    with transaction.atomic():
        updated = (
            WebhookReceipt.objects.filter(pk=receipt.pk)
            .exclude(
                status=WebhookReceipt.Status.RECEIVED,
                attempts=0,
            )
            .update(
                status=WebhookReceipt.Status.RECEIVED,
                status_reason=f"reprocess requested by {by or 'unknown'}"[:500],
            )
        )
        if updated:
            transaction.on_commit(lambda: receipt_dispatch(receipt.pk))
    log.info("webhook.reprocess", receipt_id=receipt.pk, by=by, requeued=bool(updated))
    return bool(updated)
