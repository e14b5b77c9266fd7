"""The web entry point: live streams on Django's ASGI handler, the rest on a thread pool.

The server is the real uvicorn process serving ``agentplatform.asgi``, as deployed.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import uuid
from pathlib import Path
from unittest import mock

import httpx
import pytest

from tests.conftest import web_server
from tests.webhooks.test_webhook_support import GITHUB_SECRET, github_headers
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

# The entry point sets its process's defaults (a connection pool, batched wake-ups) in
# os.environ when imported. This process starts the tests' workers, which inherit its
# environment and must run with a worker's own defaults.
with mock.patch.dict("os.environ"):
    from agentplatform.asgi import streams

RUN = "0b9c3c0e-1d1a-4a52-9d2e-8a6b9f0c1d2e"


@pytest.mark.parametrize(
    ("path", "stream"),
    [
        (f"/api/runs/{RUN}/stream", True),
        ("/admin/live/", True),
        (f"/admin/runs/run/{RUN}/live/", True),
        ("/api/tasks/", False),
        (f"/api/runs/{RUN}/events/", False),
        ("/webhooks/github/", False),
        ("/admin/", False),
        ("/static/console.css", False),
        ("/no/such/page", False),
    ],
)
def test_only_async_views_count_as_streams(path: str, stream: bool) -> None:
    assert streams(path) is stream


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def test_requests_run_on_a_fixed_pool_of_threads() -> None:
    """32 concurrent requests never take more threads than WEB_THREADS.

    Django's ASGI handler starts a thread for every request in flight: the same load made
    the process grow by about as many threads as there were concurrent requests.
    """
    with web_server(WEB_THREADS="4") as (url, process):
        with httpx.Client(timeout=30) as client:
            for _ in range(8):  # the pool's threads and the database pool start
                assert client.get(f"{url}/readyz").status_code == 200
        before = _threads(process.pid)
        peak = before
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _threads(process.pid))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(32) as pool:
                answers = list(pool.map(lambda _: httpx.get(f"{url}/readyz"), range(320)))
        finally:
            done.set()
            sampler.join()
        assert {a.status_code for a in answers} == {200}
        assert peak - before <= 4, f"{peak - before} threads started for 32 concurrent requests"


def test_a_chunked_webhook_is_read_whole_and_accepted() -> None:
    """A body without Content-Length (chunked) reaches the signature check whole."""
    body = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    delivery = str(uuid.uuid4())
    headers = github_headers(body, "ping", delivery=delivery)
    headers.pop("Content-Length", None)
    with web_server(GITHUB_WEBHOOK_SECRET=GITHUB_SECRET) as (url, _):
        answer = httpx.post(
            f"{url}/webhooks/github/",
            content=iter([body[:10], body[10:]]),  # an iterator is sent chunked
            headers={**headers, "Content-Type": "application/json"},
            timeout=30,
        )
    assert answer.status_code == 202, answer.text
    assert WebhookReceipt.objects.filter(delivery_id=delivery).count() == 1
