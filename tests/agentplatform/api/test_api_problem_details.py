"""Every API error is an RFC 9457 problem: throttling, 404s (DRF's and Django's), 405."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from agentplatform.api.auth import api_token_issue
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()
    yield
    cache.clear()


def test_unknown_path_under_api_is_a_problem_404():
    response = Client().get("/api/no-such-thing/")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert set(response.json()) >= PROBLEM_KEYS


def test_unknown_path_elsewhere_keeps_djangos_page():
    response = Client().get("/no-such-thing/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_wrong_method_is_a_problem_405():
    client = APIClient()
    client.force_authenticate(UserFactory())

    response = client.put("/api/tasks/", {}, format="json")

    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_throttled_token_gets_429_problem_with_retry_after(settings):
    settings.API_THROTTLE_TOKEN_RATE = "3/minute"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_issue(user=UserFactory())[1]}")

    statuses = [client.get("/api/tasks/").status_code for _ in range(4)]
    response = client.get("/api/tasks/")

    assert statuses == [200, 200, 200, 429]
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) >= 1


def test_user_rate_covers_all_of_a_users_tokens(settings):
    settings.API_THROTTLE_USER_RATE = "2/minute"
    user = UserFactory()
    first, second = APIClient(), APIClient()
    first.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_issue(user=user)[1]}")
    second.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_issue(user=user)[1]}")

    codes = [
        first.get("/api/tasks/").status_code,
        second.get("/api/tasks/").status_code,
        second.get("/api/tasks/").status_code,
    ]

    assert codes == [200, 200, 429]


def test_cors_is_off_by_default():
    response = Client().get("/api/schema/", HTTP_ORIGIN="https://evil.example")

    assert response.status_code == 200
    assert "Access-Control-Allow-Origin" not in response


def test_schema_and_docs_are_served():
    client = Client()
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/api/docs/redoc/").status_code == 200
