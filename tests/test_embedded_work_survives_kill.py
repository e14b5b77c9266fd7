"""Embedded mode keeps the guarantee its transport cannot: the file broker deletes a
message when a worker takes it (no late ack), so a worker killed mid-delivery loses the
message; the work item's row and the work sweep bring the delivery back."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from jobs.consumers import Consumer, Event
from jobs.models import ProcessedEvent, WorkItem
from jobs.relay import outbox_drain
from tests.conftest import wait_for
from tests.test_work_items import _sweep_until, _turns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def kill_once(event: Event) -> None:
    """The first delivery kills its whole worker (parent and children), as an OOM kill
    of the host's worker would; later ones succeed."""
    flag = Path(os.environ["KILL_FLAG"])
    if flag.exists():
        flag.unlink()
        os.killpg(os.getpgid(0), signal.SIGKILL)


KILL_ONCE = Consumer(name="kill_once", types=("agent.model.turn.completed",), handle=kill_once)


@pytest.fixture
def embedded_broker(monkeypatch):
    """This process and its workers on the embedded file transport."""
    from agentplatform.celery import app

    # Where workers started by the tests (same VAR_DIR) keep the embedded broker.
    folder = Path(settings.VAR_DIR) / "broker"
    (folder / "control").mkdir(parents=True, exist_ok=True)
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
    # Read before the environment changes: Celery's broker_write_url falls back to
    # CELERY_BROKER_URL from the environment.
    original = (app.conf.broker_write_url, app.conf.broker_transport_options)
    monkeypatch.setenv("CELERY_BROKER_URL", "fsatomic://")
    app.conf.broker_write_url = "fsatomic://"
    app.conf.broker_transport_options = options
    app._pool = None
    app.amqp._producer_pool = None
    yield folder
    app.conf.broker_write_url, app.conf.broker_transport_options = original
    app._pool = None
    app.amqp._producer_pool = None


def test_a_delivery_whose_embedded_worker_was_killed_is_delivered_by_the_next(
    settings, workspace, embedded_broker, start_worker, monkeypatch, tmp_path
):
    flag = tmp_path / "kill"
    flag.touch()
    stream = f"test_embedded.{uuid.uuid4().hex}"
    consumers = "tests.test_embedded_work_survives_kill.KILL_ONCE"
    monkeypatch.setenv("KILL_FLAG", str(flag))
    monkeypatch.setenv("EVENT_CONSUMERS", consumers)
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    settings.EVENT_CONSUMERS = [consumers]
    first = start_worker("embedded-a", queues="events", concurrency=1)
    (event_id,) = _turns(workspace, 1)
    outbox_drain()
    item = WorkItem.objects.get(kind="event.consume", key=f"kill_once:{event_id}")

    wait_for(lambda: first.process.poll() is not None, timeout=30, message="worker killed")
    assert not flag.exists()
    # The file transport deleted the message when the worker took it: nothing is left on
    # the events queue. (The relay's own queue may still hold the wake-up the turns'
    # commit sent; the drain above already published them.)
    assert not [p for p in embedded_broker.iterdir() if p.name.endswith(".events.msg")]
    assert not ProcessedEvent.objects.filter(consumer="kill_once").exists()

    start_worker("embedded-b", queues="events", concurrency=1)
    # The item is marked done after its handler's transaction (the receipt) commits: wait
    # for that, not for the receipt alone.
    _sweep_until(
        lambda: WorkItem.objects.filter(pk=item.pk, status=WorkItem.Status.DONE).exists(),
        timeout=60,
        message="delivered by the next worker",
    )
    assert ProcessedEvent.objects.filter(consumer="kill_once", event_id=event_id).exists()
    item.refresh_from_db()
    assert (item.status, item.crashes) == (WorkItem.Status.DONE, 1)
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)
