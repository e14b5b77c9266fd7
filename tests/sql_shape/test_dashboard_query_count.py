"""The operations dashboard reads a bounded number of queries."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.factories import RunFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_the_dashboard_page_reads_at_most_twenty_queries(
    client: Any, django_assert_max_num_queries: Any
) -> None:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    RunFactory.create_batch(5)
    with django_assert_max_num_queries(20):
        assert client.get(reverse("ops-dashboard")).status_code == 200
