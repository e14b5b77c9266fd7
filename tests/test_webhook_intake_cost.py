"""Intake stays a handful of statements: receipt and work item in one transaction, the
wake-up sent on commit without a write of its own, and the sweep still covers it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import WorkItem
from jobs.work import work_sweep
from tests.test_webhook_support import GITHUB_SECRET, github_post
from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db(transaction=True)

PING = {"zen": "Keep it logically awesome.", "hook_id": 1}


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split()[0].upper() for q in queries.captured_queries]


def test_an_accepted_delivery_costs_one_transaction_of_two_inserts(client) -> None:
    github_post(client, PING, "ping")  # warm: the first request may set up a connection
    with CaptureQueriesContext(connection) as queries:
        response = github_post(client, PING, "ping")
    assert response.status_code == 202
    # No savepoint around the work item, no UPDATE recording the wake-up after commit.
    assert _statements(queries) == ["BEGIN", "INSERT", "INSERT", "COMMIT"], [
        q["sql"][:120] for q in queries.captured_queries
    ]
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    item = WorkItem.objects.get(kind="webhook.process", key=str(receipt.pk))
    assert item.status == WorkItem.Status.PENDING
    assert item.args == {"receipt_id": receipt.pk}


def test_a_duplicate_delivery_writes_nothing(client) -> None:
    first = github_post(client, PING, "ping")
    delivery = WebhookReceipt.objects.get(pk=first.json()["receipt_id"]).delivery_id
    again = github_post(client, PING, "ping", delivery=delivery)
    assert (again.status_code, again.json()["receipt_id"]) == (200, first.json()["receipt_id"])
    assert WebhookReceipt.objects.count() == WorkItem.objects.count() == 1


def test_the_sweep_waits_from_the_items_creation_then_wakes_it(client, settings) -> None:
    response = github_post(client, PING, "ping")
    item = WorkItem.objects.get(key=str(response.json()["receipt_id"]))
    # Its wake-up went on commit: the sweep leaves it alone for the re-wake interval...
    assert work_sweep().woken == 0
    # ...counted from when it was created (and woken), and wakes it once that passed.
    WorkItem.objects.filter(pk=item.pk).update(
        created_at=item.created_at - timedelta(seconds=settings.WORK_REWAKE_SECONDS + 1)
    )
    assert work_sweep().woken == 1
    item.refresh_from_db()
    assert item.woken_at is not None and item.wakes == 1
