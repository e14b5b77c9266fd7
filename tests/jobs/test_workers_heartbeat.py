"""Workers report themselves: the workers page and /readyz see who is alive, on which
queues, running what; a stopped or killed worker stops counting."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobs.models import WorkerHeartbeat
from tests.conftest import wait_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def quick_heartbeats(monkeypatch: Any, settings: Any) -> None:
    # The worker processes read the environment; this process reads settings.
    monkeypatch.setenv("WORKER_HEARTBEAT_SECONDS", "0.5")
    settings.WORKER_HEARTBEAT_SECONDS = 0.5
    settings.READYZ_REQUIRE_WORKERS = True


def _ready() -> Any:
    return Client().get("/readyz")


def test_readyz_requires_a_live_worker_per_queue(quick_heartbeats: Any, start_worker: Any):
    before = _ready()
    assert before.status_code == 503
    assert before.json()["checks"]["workers"].startswith("no live worker for queue")

    agent_only = start_worker("a", queues="agent")
    wait_for(lambda: WorkerHeartbeat.objects.exists(), timeout=30, message="a heartbeat")
    partial = _ready()
    assert partial.status_code == 503
    assert "verify" in partial.json()["checks"]["workers"]
    assert "agent" not in partial.json()["checks"]["workers"].split("queue ")[1].split(", ")

    start_worker("b", queues="verify,events,webhooks", concurrency=1)
    wait_for(lambda: _ready().status_code == 200, timeout=30, message="ready")

    agent_only.kill()  # no goodbye: its heartbeat just stops
    wait_for(lambda: _ready().status_code == 503, timeout=30, message="the silent worker to count")
    assert "agent" in _ready().json()["checks"]["workers"]


def test_the_workers_page_shows_queues_concurrency_and_liveness(
    quick_heartbeats: Any, start_worker: Any, client: Any
):
    worker = start_worker("pagey", queues="agent,verify", concurrency=2)
    row = wait_for(
        lambda: WorkerHeartbeat.objects.filter(name__startswith="pagey").first(),
        timeout=30,
        message="the worker's row",
    )
    assert (row.queues, row.concurrency) == (["agent", "verify"], 2)
    client.force_login(UserFactory(is_staff=True, is_superuser=True))

    html = client.get("/admin/workers/").content.decode()
    assert f'data-worker="{row.name}" data-alive="true"' in html
    assert "agent, verify" in html

    worker.stop()  # a clean shutdown says goodbye
    row.refresh_from_db()
    assert row.stopped_at is not None
    html = client.get("/admin/workers/").content.decode()
    assert f'data-worker="{row.name}" data-alive="false"' in html
    assert "stopped" in html
