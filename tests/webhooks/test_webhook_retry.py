"""Failed processing: recorded on the receipt, retried with backoff, dead-lettered,
and reprocessable from the admin's service."""

from __future__ import annotations

import pytest
from django.db import transaction

from jobs.models import DeadLetter
from tests.conftest import wait_for
from tests.webhooks.test_webhook_support import corpus
from webhooks.intake import receipt_work_enqueue
from webhooks.models import WebhookReceipt
from webhooks.services import webhook_receipt_reprocess

pytestmark = pytest.mark.django_db(transaction=True)


def test_failing_receipt_retries_then_dead_letters_and_can_be_reprocessed(
    monkeypatch, start_worker
):
    monkeypatch.setenv("WEBHOOK_PROCESS_MAX_RETRIES", "1")
    monkeypatch.setenv("WEBHOOK_PROCESS_RETRY_BASE_SECONDS", "0.2")
    start_worker(queues="webhooks", concurrency=1)
    payload = corpus("github", "issues/labeled")
    # A repository id that is not a number: the lookup fails for real, every attempt.
    receipt = WebhookReceipt.objects.create(
        provider="github",
        hook_id="1",
        delivery_id="broken",
        event="issues",
        action="labeled",
        payload=payload,
        repository_ids=["not-a-number"],
    )
    with transaction.atomic():
        receipt_work_enqueue(receipt.pk)

    letter = wait_for(
        lambda: DeadLetter.objects.filter(task_name="webhook.process").first(),
        timeout=60,
        message="dead letter",
    )
    assert letter.kwargs == {"receipt_id": receipt.pk}
    receipt.refresh_from_db()
    assert receipt.status == WebhookReceipt.Status.FAILED
    assert receipt.attempts == 2  # the first try and one retry
    assert "ValueError" in receipt.error or "not-a-number" in receipt.error

    WebhookReceipt.objects.filter(pk=receipt.pk).update(repository_ids=[])
    assert webhook_receipt_reprocess(receipt=receipt, by="operator") is True

    done = wait_for(
        lambda: WebhookReceipt.objects.filter(
            pk=receipt.pk, status__in=["processed", "ignored"]
        ).first(),
        timeout=30,
        message="reprocessed receipt",
    )
    assert done.error == ""
    assert done.attempts == 3


@pytest.mark.django_db
def test_reprocess_of_a_receipt_still_waiting_is_refused():
    with transaction.atomic():
        receipt = WebhookReceipt.objects.create(provider="github", delivery_id="new", event="ping")
        receipt_work_enqueue(receipt.pk)
    assert webhook_receipt_reprocess(receipt=receipt, by="operator") is False


@pytest.mark.django_db
def test_reprocess_of_a_received_receipt_without_pending_work_is_accepted():
    """A receipt whose processing was never recorded (or finished) can be replayed."""
    receipt = WebhookReceipt.objects.create(provider="github", delivery_id="lost", event="ping")
    assert webhook_receipt_reprocess(receipt=receipt, by="operator") is True
    assert webhook_receipt_reprocess(receipt=receipt, by="operator") is False


def test_processing_retry_delay_follows_its_setting(settings):
    from django.apps import apps

    from jobs.work import work_kind
    from webhooks.intake import WORK_KIND

    config = apps.get_app_config("webhooks")
    settings.WEBHOOK_PROCESS_RETRY_BASE_SECONDS = 0.25
    try:
        config.ready()
        assert work_kind(WORK_KIND).retry_base_seconds == 0.25
    finally:
        settings.WEBHOOK_PROCESS_RETRY_BASE_SECONDS = 2.0
        config.ready()
    assert work_kind(WORK_KIND).retry_base_seconds == 2.0
