"""Long lists count with a bounded statement, and a caller in no workspace costs no list query."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agentplatform.api.pagination import LimitOffsetPagination
from runs.models import Membership, Run
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


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
                repository=repository,
                run_no=1,
            )
            for _ in range(30)
        ]
    )
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_a_caller_in_no_workspace_gets_an_empty_page_without_a_query() -> None:
    api = APIClient()
    api.force_authenticate(UserFactory())
    with CaptureQueriesContext(connection) as queries:
        body = api.get("/api/runs/").json()
    assert (body["count"], body["results"], body["next"]) == (0, [], None)
    assert not [q for q in queries.captured_queries if "runs_run" in q["sql"]]


def test_the_count_far_from_the_end_reads_no_further_than_its_lookahead(
    client, monkeypatch
) -> None:
    monkeypatch.setattr(LimitOffsetPagination, "count_lookahead", 5)
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/runs/?limit=10").json()["count"] == 15
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"]]
    assert counts and all("LIMIT 15" in sql for sql in counts)
