"""A job that meets a lost database connection is retried, never dead-lettered at once
(as a PostgreSQL restart or failover does to every connection)."""

from __future__ import annotations

import pytest

from jobs.models import DeadLetter
from jobs.tasks import outbox_relay
from tests.conftest import database_backend_terminate

pytestmark = pytest.mark.django_db(transaction=True)


def test_outbox_relay_survives_a_terminated_database_connection():
    database_backend_terminate()

    result = outbox_relay.apply()

    assert result.successful(), result.traceback
    assert not DeadLetter.objects.exists()
