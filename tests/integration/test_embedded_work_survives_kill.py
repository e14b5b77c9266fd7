"""On the embedded default's broker (Valkey, as any Redis) a worker killed mid-delivery
leaves the message unacknowledged in the broker, which redelivers it only after its
visibility timeout (an hour); the work item's row and the work sweep bring the delivery
back long before."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
import redis

from jobs.consumers import Consumer, Event
from jobs.models import ProcessedEvent, WorkItem
from jobs.relay import outbox_drain
from tests.conftest import wait_for
from tests.jobs.test_work_items import _sweep_until, _turns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def kill_once(event: Event) -> None:
    """The first delivery kills its whole worker (parent and children), as an OOM kill
    of the host's worker would; later ones succeed."""
    flag = Path(os.environ["KILL_FLAG"])
    if flag.exists():
        flag.unlink()
        os.killpg(os.getpgid(0), signal.SIGKILL)


KILL_ONCE = Consumer(name="kill_once", types=("agent.model.turn.completed",), handle=kill_once)


def test_a_delivery_whose_worker_was_killed_is_delivered_by_the_next(
    settings, workspace, start_worker, monkeypatch, tmp_path
):
    flag = tmp_path / "kill"
    flag.touch()
    stream = f"test_embedded.{uuid.uuid4().hex}"
    consumers = "tests.integration.test_embedded_work_survives_kill.KILL_ONCE"
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
    # The broker keeps the taken message unacknowledged, off the events queue: no worker
    # gets it again before the visibility timeout.
    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).llen("events") == 0
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
