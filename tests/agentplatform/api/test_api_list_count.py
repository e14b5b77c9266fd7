"""Long lists count only as far as they must: exact near the page, a lower bound past it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
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
                repository=repository,
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
    page = client.get("/api/runs/?limit=10").json()
    assert page["count"] == 15  # 10 on the page + 5 looked ahead, of 30
    assert len(page["results"]) == 10
    assert page["next"] is not None


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


@pytest.mark.parametrize("offset", [0, 10, 25, 40])
def test_the_page_and_the_count_are_what_the_orm_reads(client, monkeypatch, offset) -> None:
    monkeypatch.setattr(LimitOffsetPagination, "count_lookahead", 5)
    Run.objects.filter(pk__in=Run.objects.order_by("id").values("pk")[:4]).update(
        status=Run.Status.FAILED, cost_usd=Decimal("0.25"), finished_at=timezone.now()
    )
    body = client.get(f"/api/runs/?limit=10&offset={offset}").json()
    ordered = Run.objects.order_by("-created_at", "id").values_list("pk", flat=True)
    assert [row["id"] for row in body["results"]] == (
        [str(pk) for pk in ordered[offset : offset + 10]] if offset <= 30 else []
    )
    assert body["count"] == min(30, offset + 10 + 5)
