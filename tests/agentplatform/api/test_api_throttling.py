"""Rate limits hold across web processes: the counts live in Redis, each check is atomic,
and an unreachable store lets requests through instead of failing them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import AnonymousUser
from rest_framework.test import APIClient
from structlog.testing import capture_logs

from agentplatform.api.auth import api_token_issue
from agentplatform.api.throttling import TokenRateThrottle
from agentplatform.checks import throttle_rates_check
from runs.models import ApiToken
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

# Another web process's view of one token's requests: a process of its own, with the same
# settings and the same Redis, checking the token throttle twice.
OTHER_PROCESS = """
import sys
from types import SimpleNamespace
import django
django.setup()
from django.contrib.auth.models import AnonymousUser
from agentplatform.api.throttling import TokenRateThrottle
from runs.models import ApiToken
request = SimpleNamespace(auth=ApiToken(pk=int(sys.argv[1])), user=AnonymousUser())
print([TokenRateThrottle().allow_request(request, None) for _ in range(2)])
"""


def _client_with_token() -> tuple[APIClient, ApiToken]:
    token, secret = api_token_issue(user=UserFactory())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client, token


def test_another_process_counts_against_the_same_limit(settings):
    settings.API_THROTTLE_TOKEN_RATE = "3/minute"
    client, token = _client_with_token()

    here = [client.get("/api/tasks/").status_code for _ in range(2)]
    there = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(token.pk)],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "API_THROTTLE_TOKEN_RATE": "3/minute",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    after = client.get("/api/tasks/")

    assert there.returncode == 0, there.stderr
    assert here == [200, 200]
    # The other process had one request left of the three, and used it.
    assert there.stdout.strip().splitlines()[-1] == "[True, False]"
    assert after.status_code == 429
    assert int(after["Retry-After"]) >= 1


def test_concurrent_checks_never_grant_more_than_the_rate(settings):
    settings.API_THROTTLE_TOKEN_RATE = "20/minute"
    request = SimpleNamespace(auth=ApiToken(pk=987_654), user=AnonymousUser())
    granted: list[bool] = []
    start = threading.Barrier(8)

    def check() -> None:
        start.wait()
        results = [TokenRateThrottle().allow_request(request, None) for _ in range(10)]
        granted.extend(results)

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(granted) == 80
    assert granted.count(True) == 20


def test_unreachable_store_lets_requests_through_and_says_so(settings):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.API_THROTTLE_STORAGE_URL = f"redis://127.0.0.1:{port}/0"
    settings.API_THROTTLE_TOKEN_RATE = "1/minute"
    client, _ = _client_with_token()

    with capture_logs() as logs:
        statuses = [client.get("/api/tasks/").status_code for _ in range(3)]

    assert statuses == [200, 200, 200]
    assert any(entry["event"] == "api.throttle_unavailable" for entry in logs)


def test_a_rate_the_throttles_cannot_read_fails_the_checks(settings):
    settings.API_THROTTLE_USER_RATE = "lots"
    settings.API_THROTTLE_TOKEN_RATE = "600/minute"
    settings.API_THROTTLE_ANON_RATE = ""

    errors = throttle_rates_check(None)

    assert [error.id for error in errors] == ["agentplatform.E005"]
    assert "API_THROTTLE_USER_RATE" in errors[0].msg
