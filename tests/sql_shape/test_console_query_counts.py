"""Console pages cost a bounded number of queries, whatever the rows behind them."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.factories import (
    DeadLetterFactory,
    OutboxEventFactory,
    RunFactory,
    TaskFactory,
    UserFactory,
    WebhookReceiptFactory,
)
from tests.runs.test_admin_run_page import run_history_create

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


@pytest.fixture
def su_client(client: Any, db: Any) -> Any:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def admin_client_su(client: Any, db: Any) -> Any:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize(
    "name",
    ["runs_run", "runs_task", "jobs_deadletter", "jobs_outboxevent", "webhooks_webhookreceipt"],
)
def test_changelist_query_count_does_not_grow_with_rows(
    su_client: Any,
    db: Any,
    django_assert_max_num_queries: Any,
    name: str,
) -> None:
    url = reverse(f"admin:{name}_changelist")
    factories = {
        "runs_run": RunFactory,
        "runs_task": TaskFactory,
        "jobs_deadletter": DeadLetterFactory,
        "jobs_outboxevent": OutboxEventFactory,
        "webhooks_webhookreceipt": WebhookReceiptFactory,
    }
    factories[name].create_batch(2)
    su_client.get(url)
    with django_assert_max_num_queries(14) as few:
        su_client.get(url)
    factories[name].create_batch(40)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert su_client.get(url).status_code == 200


def test_run_page_query_count_does_not_grow_with_history(
    admin_client_su: Any,
    django_assert_max_num_queries: Any,
) -> None:
    run = run_history_create()
    url = reverse("admin:runs_run_change", args=[run.pk])
    admin_client_su.get(url)
    with django_assert_max_num_queries(30):
        assert admin_client_su.get(url).status_code == 200
