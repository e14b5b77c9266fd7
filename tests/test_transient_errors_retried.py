"""A job that meets a lost database connection is retried, never dead-lettered at once
(as a PostgreSQL restart or failover does to every connection)."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs.models import DeadLetter
from jobs.tasks import outbox_relay

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_own_backend() -> None:
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    db = settings.DATABASES["default"]
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_outbox_relay_survives_a_terminated_database_connection():
    _terminate_own_backend()

    result = outbox_relay.apply()

    assert result.successful(), result.traceback
    assert not DeadLetter.objects.exists()
