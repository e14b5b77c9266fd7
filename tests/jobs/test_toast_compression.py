"""Large values on the write paths are compressed with lz4 where the server has it.

A webhook's payload (several kB on most deliveries), a model turn's response and an
artifact's content are stored out of line and compressed first; lz4 costs PostgreSQL
less time than pglz (jobs/toast.py).
"""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.toast import lz4_available
from tests.factories import WebhookReceiptFactory

pytestmark = pytest.mark.django_db

COLUMNS = [
    ("webhooks_webhookreceipt", "payload"),
    ("runs_artifact", "content"),
    ("runs_modelturn", "response"),
]


def test_the_large_columns_compress_with_lz4_when_the_server_has_it():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attrelid::regclass::text, attname, attcompression FROM pg_attribute"
            " WHERE (attrelid::regclass::text, attname) IN"
            " (SELECT t, c FROM unnest(%s::text[], %s::text[]) AS x(t, c))",
            [[t for t, _ in COLUMNS], [c for _, c in COLUMNS]],
        )
        methods = {(table, column): method for table, column, method in cursor.fetchall()}
    expected = "l" if lz4_available(connection) else ""
    assert methods == dict.fromkeys(COLUMNS, expected)


def test_a_large_payload_is_stored_compressed_with_the_servers_best_method():
    # lz4 where the server was built with it (the system packages are); pglz otherwise
    # (the embedded server's wheel has no lz4).
    expected = "lz4" if lz4_available(connection) else "pglz"
    payload = {"commits": [{"message": f"change {i}", "id": f"{i:040x}"} for i in range(200)]}
    receipt = WebhookReceiptFactory(payload=payload)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_compression(payload), pg_column_size(payload)"
            " FROM webhooks_webhookreceipt WHERE id = %s",
            [receipt.pk],
        )
        method, size = cursor.fetchone()
    assert method == expected
    assert size < len(str(payload)) / 2
    receipt.refresh_from_db()
    assert receipt.payload == payload
