"""Beat keeps its schedule across a restart of its broker (a Redis of the test's own)."""

from __future__ import annotations

import pytest
import redis
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tests.conftest import wait_for
from tests.jobs.test_beat_two_processes import Beat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE_QUEUE = "test_h11.beat_probe"


def test_beat_keeps_sending_after_its_redis_restarts(own_redis, monkeypatch, tmp_path):
    monkeypatch.setenv("CELERY_BROKER_URL", own_redis.url)
    PeriodicTask.objects.all().delete()
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.create(
        name="beat probe", task="runs.tasks_readmit", interval=every_second, queue=PROBE_QUEUE
    )
    client = redis.Redis.from_url(own_redis.url)
    beat = Beat("restart", tmp_path)
    try:
        wait_for(lambda: client.llen(PROBE_QUEUE) >= 2, timeout=40, message="first firings")
        client.set("before-restart", 1)
        own_redis.restart(down_seconds=2)
        # No persistence: the queue is gone. (Its length alone would not say so: beat may
        # have sent again between the restart and this line.)
        assert client.get("before-restart") is None
        wait_for(lambda: client.llen(PROBE_QUEUE) >= 2, timeout=40, message="firings after restart")
        assert beat.process.poll() is None
    finally:
        beat.stop()


def test_web_server_accepts_webhooks_across_a_restart_of_its_redis(
    own_redis, monkeypatch, tmp_path
):
    """The served app stays up; deliveries during and after the outage are stored and
    their processing waits in rows for the work sweep."""
    import json
    import os
    import subprocess
    import sys

    import httpx
    from django.conf import settings

    from jobs.models import WorkItem
    from tests.conftest import ROOT, free_port
    from tests.webhooks.test_webhook_support import CORPUS, GITHUB_SECRET, github_headers
    from webhooks.models import WebhookReceipt

    port = free_port()
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": own_redis.url,
        "REDIS_URL": own_redis.url,
        "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
    }
    log = open(tmp_path / "web.log", "ab")  # noqa: SIM115 - closed below
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agentplatform.asgi:application", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    body = (CORPUS / "github" / "ping" / "payload.json").read_bytes()
    body = json.dumps(json.loads(body)).encode()

    def deliver() -> int:
        response = httpx.post(
            f"http://127.0.0.1:{port}/webhooks/github/",
            content=body,
            headers={"Content-Type": "application/json", **github_headers(body, "ping")},
            timeout=30,
        )
        return response.status_code

    def up() -> bool:
        try:
            return deliver() == 202
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=30, interval=0.3, message="web server up")
        own_redis.stop()
        assert deliver() == 202  # Redis is down: stored, its wake-up waits in the row
        own_redis.start()
        assert deliver() == 202
        assert web.poll() is None
    finally:
        web.terminate()
        web.wait(15)
        log.close()
    receipts = WebhookReceipt.objects.count()
    assert receipts == 3
    assert WorkItem.objects.filter(kind="webhook.process").count() == receipts
