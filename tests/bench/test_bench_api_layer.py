"""The benchmark's API-layer baseline refuses and accepts what ``POST /api/tasks/`` does
before its submission: it is that endpoint's cost without admission and records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from agentplatform.api.auth import api_token_issue
from runs.models import Membership, Task
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def bench_urls() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_insert (id bigserial PRIMARY KEY, body text)")
    with override_settings(ROOT_URLCONF="bench.urls"):
        yield


def _inserted() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT body FROM bench_insert ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def test_api_layer_authenticates_validates_and_writes_one_row(bench_urls: Any) -> None:
    workspace = WorkspaceFactory()
    repository = RepositoryFactory(workspace=workspace)
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    other = RepositoryFactory()  # in a workspace the caller is not a member of
    secret = api_token_issue(user=user)[1]
    api = APIClient()
    body = {"repository": repository.pk, "instruction": "bench: do nothing"}

    assert api.post("/bench/api-layer/", body, format="json").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    refused = [
        {**body, "repository": other.pk},
        {**body, "instruction": ""},
        {**body, "unknown": 1},
    ]
    for bad in refused:
        layer = api.post("/bench/api-layer/", bad, format="json")
        endpoint = api.post("/api/tasks/", bad, format="json")
        # The same problem, but for the path it names.
        assert layer.status_code == endpoint.status_code
        assert {**layer.json(), "instance": ""} == {**endpoint.json(), "instance": ""}
        assert 400 <= layer.status_code < 500
    assert _inserted() == []

    answer = api.post("/bench/api-layer/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert answer.status_code == 202
    assert _inserted() == ["k1 bench: do nothing"]
    assert not Task.objects.exists()  # no submission: only the one row
