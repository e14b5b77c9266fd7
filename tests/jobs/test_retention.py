"""Retention deletes delivery history past its time, and nothing that work may still read.

Kept for good: pending outbox rows, deferrals (a replay reads them), dead and pending
work, failed and unprocessed receipts. Held back: the events, and their receipts, of a
consumer's or subscription's delivery that is pending or dead with its letter open.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from jobs import tasks
from jobs.models import DeadLetter, OutboxEvent, ProcessedEvent, WorkItem
from jobs.retention import retention_sweep
from jobs.schedules import beat_schedules_ensure
from jobs.services import dead_letter_discard
from webhooks.models import WebhookAction, WebhookReceipt

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=40)
RECENT = timedelta(hours=1)


def _outbox(age: timedelta, *, published: bool = True, type: str = "agent.run.started") -> Any:
    at = timezone.now() - age
    row = OutboxEvent.objects.create(type=type, partition_key="p", payload={"id": "x"})
    OutboxEvent.objects.filter(pk=row.pk).update(
        created_at=at, available_at=at, published_at=at if published else None
    )
    return row


def _processed(age: timedelta, event_id: Any, consumer: str = "cost") -> ProcessedEvent:
    row = ProcessedEvent.objects.create(consumer=consumer, event_id=event_id)
    ProcessedEvent.objects.filter(pk=row.pk).update(processed_at=timezone.now() - age)
    return row


def _work(age: timedelta, *, status: str, kind: str = "webhook.process", args: Any = None) -> Any:
    at = timezone.now() - age
    item = WorkItem.objects.create(
        kind=kind,
        key=str(uuid.uuid4()),
        args=args or {},
        queue="events",
        status=status,
        due_at=at,
        finished_at=at if status != WorkItem.Status.PENDING else None,
    )
    WorkItem.objects.filter(pk=item.pk).update(created_at=at)
    return item


def _receipt(age: timedelta, status: str) -> WebhookReceipt:
    row = WebhookReceipt.objects.create(
        provider="github", delivery_id=str(uuid.uuid4()), event="issues", status=status
    )
    WebhookReceipt.objects.filter(pk=row.pk).update(received_at=timezone.now() - age)
    return row


def _left(model: Any) -> set[Any]:
    return set(model.objects.values_list("pk", flat=True))


def test_history_past_its_retention_goes_and_everything_else_stays():
    gone_event = _outbox(OLD)
    kept_events = {
        _outbox(OLD, type="agent.task.deferred").pk,
        _outbox(OLD, published=False).pk,
        _outbox(RECENT).pk,
    }
    _processed(OLD, gone_event.event_id)
    kept_receipt_of_consumer = _processed(RECENT, uuid.uuid4()).pk
    _work(OLD, status=WorkItem.Status.DONE)
    kept_work = {
        _work(OLD, status=WorkItem.Status.DEAD).pk,
        _work(OLD, status=WorkItem.Status.PENDING).pk,
        _work(RECENT, status=WorkItem.Status.DONE).pk,
    }
    processed = _receipt(OLD, WebhookReceipt.Status.PROCESSED)
    action = WebhookAction.objects.create(provider="github", key="comment:1", receipt=processed)
    _receipt(OLD, WebhookReceipt.Status.IGNORED)
    kept_receipts = {
        _receipt(OLD, WebhookReceipt.Status.FAILED).pk,
        _receipt(OLD, WebhookReceipt.Status.RECEIVED).pk,
        _receipt(RECENT, WebhookReceipt.Status.PROCESSED).pk,
    }

    report = retention_sweep()

    assert report.deleted == {
        "outbox": 1,
        "processed_events": 1,
        "work_items": 1,
        "webhook_receipts": 2,
    }
    assert not report.more
    assert _left(OutboxEvent) == kept_events
    assert _left(ProcessedEvent) == {kept_receipt_of_consumer}
    assert _left(WorkItem) == kept_work
    assert _left(WebhookReceipt) == kept_receipts
    # The action's key stays: the same comment under a new delivery is still acted on once.
    action.refresh_from_db()
    assert action.receipt_id is None
    # A second sweep finds nothing left to delete.
    assert sum(retention_sweep().deleted.values()) == 0


def test_a_pending_consumer_delivery_holds_its_events_and_their_receipts_back():
    event = _outbox(OLD)
    receipt = _processed(OLD, event.event_id)
    item = _work(
        OLD + timedelta(minutes=5),
        status=WorkItem.Status.PENDING,
        kind="event.consume",
        args={"consumer": "cost", "event_id": str(event.event_id)},
    )

    assert sum(retention_sweep().deleted.values()) == 0
    assert OutboxEvent.objects.filter(pk=event.pk).exists()
    assert ProcessedEvent.objects.filter(pk=receipt.pk).exists()

    WorkItem.objects.filter(pk=item.pk).update(
        status=WorkItem.Status.DONE, finished_at=timezone.now() - OLD
    )
    report = retention_sweep()
    assert report.deleted["outbox"] == 1 and report.deleted["processed_events"] == 1
    assert report.deleted["work_items"] == 1


def test_a_dead_delivery_with_an_open_letter_holds_its_events_until_the_letter_is_closed():
    event = _outbox(OLD)
    item = _work(
        OLD + timedelta(minutes=5),
        status=WorkItem.Status.DEAD,
        kind="subscription.deliver",
        args={"subscription_id": 1, "event_id": str(event.event_id)},
    )
    now = timezone.now()
    letter = DeadLetter.objects.create(
        task_name="subscription.deliver",
        task_id=f"work:{item.pk}",
        exception="boom",
        first_failed_at=now,
        last_failed_at=now,
    )

    retention_sweep()
    assert OutboxEvent.objects.filter(pk=event.pk).exists()  # a requeue will read it

    assert dead_letter_discard(letter=letter, by="operator")
    retention_sweep()
    assert not OutboxEvent.objects.filter(pk=event.pk).exists()
    assert WorkItem.objects.filter(pk=item.pk).exists()  # dead work is the operator's


def test_zero_keeps_history_for_good(settings):
    settings.OUTBOX_RETENTION_DAYS = 0
    settings.WEBHOOK_RECEIPT_RETENTION_DAYS = 0
    _outbox(OLD)
    _receipt(OLD, WebhookReceipt.Status.PROCESSED)
    assert retention_sweep().deleted == {}
    assert OutboxEvent.objects.count() == 1 and WebhookReceipt.objects.count() == 1


def test_a_sweep_deletes_in_batches_within_its_time_and_the_next_goes_on():
    for _ in range(25):
        _outbox(OLD)
    kept = _outbox(RECENT).pk
    out_of_time = retention_sweep(max_seconds=0)
    assert out_of_time.more and OutboxEvent.objects.count() == 26

    report = retention_sweep(batch=10)
    assert report.deleted["outbox"] == 25 and not report.more
    assert _left(OutboxEvent) == {kept}


def test_a_row_another_transaction_holds_is_skipped_not_waited_for():
    held = _outbox(OLD)
    others = [_outbox(OLD).pk for _ in range(3)]
    connection.ensure_connection()
    dsn = connection.connection.info.dsn
    locked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with psycopg.connect(dsn) as other, other.transaction():
            other.execute("SELECT 1 FROM jobs_outboxevent WHERE id = %s FOR UPDATE", [held.pk])
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        report = retention_sweep(batch=2)
    finally:
        release.set()
        holder.join()
    assert report.deleted["outbox"] == 3
    assert _left(OutboxEvent) == {held.pk}
    assert not set(others) & _left(OutboxEvent)
    assert retention_sweep().deleted["outbox"] == 1


def test_beat_runs_the_sweep():
    from django_celery_beat.models import PeriodicTask

    beat_schedules_ensure()
    schedule = PeriodicTask.objects.get(name="retention sweep")
    assert schedule.task == "jobs.retention_sweep" and schedule.enabled
    _outbox(OLD)
    assert tasks.retention_sweep() == 1
