"""Long lists count only as far as they must: exact near the page, a lower bound past it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework import pagination
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

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


def test_one_compile_pages_values_as_drfs_own_pagination_does(client) -> None:
    """The values() rows of the page (types included) and the count, both ways."""
    Run.objects.filter(pk__in=Run.objects.order_by("id").values("pk")[:3]).update(
        cost_usd=Decimal("1.5"), started_at=timezone.now(), failure_reason="x"
    )
    queryset = Run.objects.order_by("-created_at", "id").values(
        "id", "task_id", "workspace__slug", "cost_usd", "started_at", "status", "checkpoint"
    )
    request = Request(APIRequestFactory().get("/api/runs/?limit=7&offset=3"))
    ours, theirs = LimitOffsetPagination(), LimitOffsetPagination()
    page = ours.paginate_queryset(queryset, request)
    expected = pagination.LimitOffsetPagination.paginate_queryset(theirs, queryset, request)
    assert page == expected and len(page) == 7
    assert (ours.count, ours.offset, ours.limit) == (theirs.count, theirs.offset, theirs.limit)
