"""Intake is one statement: the receipt and its work item in one INSERT (after one lookup
of the secrets of the repositories a delivery to the shared URL names), the wake-up sent
on commit without a write of its own, and the sweep still covers it."""

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
from webhooks.intake import _RECEIPT_COLUMNS, _WORK_COLUMNS
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]

PING = {"zen": "Keep it logically awesome.", "hook_id": 1}


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split()[0].upper() for q in queries.captured_queries]


def test_an_accepted_delivery_costs_one_statement(client) -> None:
    github_post(client, PING, "ping")  # warm: the first request may set up a connection
    with CaptureQueriesContext(connection) as queries:
        response = github_post(client, PING, "ping")
    assert response.status_code == 202
    # No transaction of separate INSERTs, no UPDATE recording the wake-up after commit.
    assert _statements(queries) == ["WITH"], [q["sql"][:120] for q in queries.captured_queries]
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    item = WorkItem.objects.get(kind="webhook.process", key=str(receipt.pk))
    assert item.status == WorkItem.Status.PENDING
    assert item.args == {"receipt_id": receipt.pk}
    assert item.queue == "webhooks" and item.due_at <= item.created_at


def test_the_shared_url_finds_the_repositories_it_belongs_to_in_one_lookup(client) -> None:
    """The repositories of this provider claiming the payload's id whose own secret signed
    it: one SELECT of their secrets, then the one statement."""
    signed = RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="s1")
    RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="s2")
    RepositoryFactory(provider="github", external_id="octo/hello", webhook_secret="")
    RepositoryFactory(provider="gitlab", external_id="octo/hello", webhook_secret="s1")
    RepositoryFactory(provider="github", external_id="octo/other", webhook_secret="s1")
    payload = {**PING, "repository": {"full_name": "octo/hello"}}
    with CaptureQueriesContext(connection) as queries:
        response = github_post(client, payload, "ping", secret="s1")
    assert _statements(queries) == ["SELECT", "WITH"]
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    assert receipt.repository_ids == [signed.pk]
    # Signed by the installation secret: recorded without a lookup, for no repository.
    with CaptureQueriesContext(connection) as queries:
        installation = github_post(client, payload, "ping")
    assert _statements(queries) == ["WITH"]
    assert WebhookReceipt.objects.get(pk=installation.json()["receipt_id"]).repository_ids == []


def test_the_statement_writes_every_column_of_both_tables() -> None:
    """A column added to either model must be written by the intake statement too."""
    for model, columns in ((WebhookReceipt, _RECEIPT_COLUMNS), (WorkItem, _WORK_COLUMNS)):
        fields = {f.column for f in model._meta.concrete_fields if not f.primary_key}
        assert fields == set(columns), model.__name__
        assert len(columns) == len(set(columns))


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


def _prepared_intake() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [s for (s,) in cursor.fetchall() if WebhookReceipt._meta.db_table in s]


def test_the_intake_statement_is_prepared_once_and_reused(client) -> None:
    """PostgreSQL plans the receipt's INSERT once per connection; the payload is a bound
    parameter, not a literal in the statement's text."""
    for _ in range(3):
        assert github_post(client, PING, "ping").status_code == 202
    statements = _prepared_intake()
    assert len(statements) == 1, statements
    assert "$1" in statements[0] and "logically awesome" not in statements[0]
    assert WebhookReceipt.objects.count() == 3


@pytest.mark.parametrize("prepared", [True, False])
def test_the_payload_is_stored_as_the_json_object_received(client, settings, prepared) -> None:
    """The payload is stored from its text as received: the same object as parsed,
    whatever its spacing, escapes, number forms or key order, form-encoded or not."""
    settings.DATABASE_PREPARED_STATEMENTS = prepared
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
