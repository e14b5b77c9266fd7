"""The missed-deliveries command against a local server speaking GitHub's deliveries API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db


def _delivery(id_: int, guid: str, status_code: int, hours_ago: float = 1) -> dict[str, Any]:
    delivered = timezone.now() - timezone.timedelta(hours=hours_ago)
    return {
        "id": id_,
        "guid": guid,
        "delivered_at": delivered.isoformat(),
        "redelivery": False,
        "duration": 0.1,
        "status": "OK" if status_code < 300 else "failed",
        "status_code": status_code,
        "event": "issues",
        "action": "labeled",
    }


class FakeGitHub:
    """Two pages of deliveries (newest first) and a record of redelivery attempts."""

    def __init__(self) -> None:
        self.pages = [
            [
                _delivery(10, "ok-guid", 200),
                _delivery(9, "failed-guid", 502),
                _delivery(8, "retried-guid", 200),
            ],
            [
                _delivery(7, "retried-guid", 500),
                _delivery(6, "received-guid", 0),
                _delivery(5, "old-guid", 500, hours_ago=100),
            ],
        ]
        self.attempts: list[str] = []
        self.authorization: list[str] = []
        # The host the next-page link names (another origin when not the API's own).
        self.next_host = "127.0.0.1"


@pytest.fixture
def github(settings) -> Iterator[FakeGitHub]:
    fake = FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            fake.authorization.append(self.headers.get("Authorization", ""))
            if not self.path.startswith("/repos/octo/app/hooks/42/deliveries"):
                return self._json(404, {"message": "Not Found"})
            if "cursor=page2" in self.path:
                return self._json(200, fake.pages[1])
            base = f"http://{fake.next_host}:{self.server.server_port}"
            page2 = f"{base}/repos/octo/app/hooks/42/deliveries?per_page=100&cursor=page2"
            link = f'<{page2}>; rel="next"'
            return self._json(200, fake.pages[0], {"Link": link})

        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            if parts[-1] != "attempts":
                return self._json(404, {"message": "Not Found"})
            fake.attempts.append(parts[-2])
            return self._json(202, {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.GITHUB_API_URL = f"http://127.0.0.1:{server.server_port}"
    settings.GITHUB_TOKEN = "test-token"
    yield fake
    server.shutdown()
    server.server_close()


def test_failed_deliveries_are_redelivered_once(github):
    WebhookReceipt.objects.create(
        provider="github", hook_id="42", delivery_id="received-guid", event="issues"
    )
    out = StringIO()
    call_command("webhooks_redeliver", "octo/app", "42", stdout=out)

    # failed-guid only: ok-guid succeeded, retried-guid succeeded on a later attempt,
    # received-guid reached us, old-guid is outside the window.
    assert github.attempts == ["9"]
    assert "redelivered 1" in out.getvalue()
    assert set(github.authorization) == {"Bearer test-token"}


def test_dry_run_sends_nothing(github):
    out = StringIO()
    call_command("webhooks_redeliver", "octo/app", "42", "--dry-run", stdout=out)
    assert github.attempts == []
    assert "would redeliver 2" in out.getvalue()


def test_a_next_page_link_to_another_host_gets_no_token(github):
    github.next_host = "localhost"  # the same listener, but not the API's origin
    call_command("webhooks_redeliver", "octo/app", "42", "--dry-run", stdout=StringIO())

    assert github.authorization == ["Bearer test-token", ""]
