"""Operator use cases on webhook receipts."""

from __future__ import annotations

from django.db import transaction

from jobs.models import WorkItem
from webhooks.intake import WORK_KIND, receipt_work_enqueue
from webhooks.logs import log
from webhooks.models import WebhookReceipt


def webhook_receipt_reprocess(*, receipt: WebhookReceipt, by: str = "") -> bool:
    """Process a receipt again; False if its processing is still pending anyway.

    Safe for any receipt, processed ones included: every command processing issues is
    guarded by a semantic key or an idempotency key, so a replay only acts where the
    first attempt did not (a failure, or a repository mapped since).
    """
    with transaction.atomic():
        locked = WebhookReceipt.objects.select_for_update().filter(pk=receipt.pk).first()
        pending = WorkItem.objects.filter(
            kind=WORK_KIND, key=str(receipt.pk), status=WorkItem.Status.PENDING
        ).exists()
        requeued = locked is not None and not pending
        if requeued:
            WebhookReceipt.objects.filter(pk=receipt.pk).update(
                status=WebhookReceipt.Status.RECEIVED,
                status_reason=f"reprocess requested by {by or 'unknown'}"[:500],
            )
            receipt_work_enqueue(receipt.pk, reopen=True)
    log.info("webhook.reprocess", receipt_id=receipt.pk, by=by, requeued=requeued)
    return requeued
