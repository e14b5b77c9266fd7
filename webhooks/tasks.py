"""Celery entry points for webhooks: load the receipt by id, call the processing service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from jobs.durable import DurableTask


@shared_task(
    name="webhooks.receipt_process",
    base=DurableTask,
    bind=True,
    autoretry_for=(Exception,),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=settings.WEBHOOK_PROCESS_MAX_RETRIES,
    ignore_result=True,
)
def receipt_process(self: DurableTask, receipt_id: int) -> str:
    """Process one receipt; a receipt already processed is a no-op, so retries are safe."""
    from webhooks.processing import webhook_receipt_process

    return webhook_receipt_process(receipt_id=receipt_id)
