"""Long lists count only as far as they must: exact near the page, a lower bound past it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agentplatform.api.pagination import LimitOffsetPagination
from runs.models import Membership, Run
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> APIClient:
    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    repository = RepositoryFactory(workspace=workspace)
    Run.objects.bulk_create(
        [
            Run(
                task=TaskFactory(workspace=workspace, repository=repository),
                workspace=workspace,
                run_no=1,
            )
            for _ in range(30)
        ]
    )
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_count_is_a_lower_bound_far_from_the_end(client, monkeypatch) -> None:
    monkeypatch.setattr(LimitOffsetPagination, "count_lookahead", 5)
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/api/runs/?limit=10").json()
    assert page["count"] == 15  # 10 on the page + 5 looked ahead, of 30
    assert len(page["results"]) == 10
    assert page["next"] is not None
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"]]
    assert counts and all("LIMIT 15" in sql for sql in counts)


def test_count_is_exact_near_the_end_and_paging_reaches_it(client, monkeypatch) -> None:
    monkeypatch.setattr(LimitOffsetPagination, "count_lookahead", 5)
    seen = 0
    url = "/api/runs/?limit=10"
    while url:
        page = client.get(url).json()
        seen += len(page["results"])
        url = page["next"]
    assert seen == 30
    assert page["count"] == 30
