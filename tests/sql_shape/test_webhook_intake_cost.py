"""Intake is one transaction of two INSERTs, the receipt and its work item (after one
lookup of the secrets of the repositories a delivery to the shared URL names), the
wake-up sent on commit without a write of its own, and the sweep still covers it."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import WorkItem
from jobs.work import work_sweep
from tests.factories import RepositoryFactory
from tests.webhooks.test_webhook_support import GITHUB_SECRET, github_headers, github_post
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]

PING = {"zen": "Keep it logically awesome.", "hook_id": 1}


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split()[0].upper() for q in queries.captured_queries]


def test_an_accepted_delivery_costs_two_inserts(client) -> None:
    github_post(client, PING, "ping")  # warm: the first request may set up a connection
    with CaptureQueriesContext(connection) as queries:
        response = github_post(client, PING, "ping")
    assert response.status_code == 202
    # No transaction of separate INSERTs, no UPDATE recording the wake-up after commit.
    assert _statements(queries) == ["BEGIN", "INSERT", "INSERT", "COMMIT"], [
        q["sql"][:120] for q in queries.captured_queries
    ]
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    item = WorkItem.objects.get(kind="webhook.process", key=str(receipt.pk))
    assert item.status == WorkItem.Status.PENDING
    assert item.args == {"receipt_id": receipt.pk}
    assert item.queue == "webhooks" and item.due_at <= item.created_at


def test_the_shared_url_finds_the_repositories_it_belongs_to_in_one_lookup(client) -> None:
    """The repositories of this provider claiming the payload's id whose own secret signed
    it: one SELECT of their secrets, then the two INSERTs."""
    signed = RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="s1")
    RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="s2")
    RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="")
    RepositoryFactory(provider="gitlab", external_id="octo/hello", webhook_secret="s1")
    RepositoryFactory(provider="github", external_id="octo/other", webhook_secret="s1")
    payload = {**PING, "repository": {"full_name": "octo/hello"}}
    with CaptureQueriesContext(connection) as queries:
        response = github_post(client, payload, "ping", secret="s1")
    assert _statements(queries) == ["SELECT", "BEGIN", "INSERT", "INSERT", "COMMIT"]
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    assert receipt.repository_ids == [signed.pk]
    # Signed by the installation secret: recorded without a lookup, for no repository.
    with CaptureQueriesContext(connection) as queries:
        installation = github_post(client, payload, "ping")
    assert _statements(queries) == ["BEGIN", "INSERT", "INSERT", "COMMIT"]
    assert WebhookReceipt.objects.get(pk=installation.json()["receipt_id"]).repository_ids == []


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


def test_the_payload_is_stored_as_the_json_object_received(client) -> None:
    """The payload is stored as the object received, whatever its spacing, escapes,
    number forms or key order, form-encoded or not."""
    body = (
        b'{ "zen" : "caf\\u00e9 \xe2\x9c\x93 \\"quoted\\" \\n",\n  "hook_id": 12345678901234567890,'
        b' "b": [1.0, 1e2, -0.5, true, null, {}], "a": {"z": 1, "a": 2}, "zen2": "x" }'
    )
    response = github_post(client, body, "ping")
    assert response.status_code == 202, response.content
    stored = WebhookReceipt.objects.get(pk=response.json()["receipt_id"]).payload
    assert stored == json.loads(body)

    form = urlencode({"payload": body.decode()}).encode()
    response = client.post(
        "/webhooks/github/",
        data=form,
        content_type="application/x-www-form-urlencoded",
        headers=github_headers(form, "ping"),
    )
    assert response.status_code == 202, response.content
    stored = WebhookReceipt.objects.get(pk=response.json()["receipt_id"]).payload
    assert stored == json.loads(body)
