"""Several relays at once: every event published once, in order within each run."""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from jobs.models import OutboxEvent
from jobs.relay import outbox_drain, outbox_relay_batch
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stream():
    name = f"test_h4.order.{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    with override_settings(EVENT_STREAM_NAME=name, EVENT_CONSUMERS=[]):
        yield name, client
    client.delete(name)


def _runs(workspace, count: int) -> list[tuple]:
    pairs = []
    for _ in range(count):
        task = TaskFactory(workspace=workspace)
        pairs.append((task, Run.objects.create(task=task, run_no=1)))
    return pairs


def _record(pairs, rounds: int) -> None:
    # Interleaved commits, as concurrent runs produce them.
    for i in range(rounds):
        for task, run in pairs:
            with transaction.atomic():
                events_record(
                    task=task,
                    run=run,
                    events=[
                        PendingEvent("agent.run.status.changed", {"from": "a", "to": "b", "i": i})
                    ],
                )


def _published(client, name) -> dict[str, list[int]]:
    sequences = defaultdict(list)
    for _, fields in client.xrange(name):
        event = json.loads(fields[b"event"])
        sequences[event["runid"]].append(event["sequence"])
    return sequences


def test_concurrent_relays_publish_each_event_once_in_order_per_run(workspace, stream):
    name, client = stream
    pairs = _runs(workspace, 6)
    _record(pairs, 15)
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            while outbox_relay_batch(limit=7, partitions=2).claimed:
                pass
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=relay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    outbox_drain()

    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    sequences = _published(client, name)
    assert set(sequences) == {str(run.id) for _, run in pairs}
    for run_sequences in sequences.values():
        assert run_sequences == list(range(1, 16))


def test_a_partition_backing_off_does_not_block_the_others(workspace, stream):
    name, client = stream
    (slow_task, slow_run), (ok_task, ok_run) = _runs(workspace, 2)
    _record([(slow_task, slow_run), (ok_task, ok_run)], 3)
    head = OutboxEvent.objects.filter(partition_key=str(slow_run.id)).order_by("id").first()
    OutboxEvent.objects.filter(pk=head.pk).update(
        available_at=timezone.now() + timedelta(minutes=5), attempts=1
    )

    outbox_drain()

    sequences = _published(client, name)
    assert sequences[str(ok_run.id)] == [1, 2, 3]
    # Nothing of the waiting run leaves before its head: order beats progress.
    assert str(slow_run.id) not in sequences
    assert (
        OutboxEvent.objects.filter(
            partition_key=str(slow_run.id), published_at__isnull=True
        ).count()
        == 3
    )
