"""Relay wake-ups coalesce: one relay task queued or running, however many commits wake it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

import jobs.relay
from jobs.relay import RELAY_QUEUE, BatchReport, relay_wake, relay_wake_reset
from jobs.tasks import outbox_relay

pytestmark = pytest.mark.services


@pytest.fixture
def broker() -> Iterator[Any]:
    from agentplatform.celery import app

    app.control.purge()
    relay_wake_reset()
    yield redis.Redis.from_url(settings.CELERY_BROKER_URL)
    app.control.purge()
    relay_wake_reset()


def relay_messages(client: Any) -> int:
    return sum(
        json.loads(raw)["headers"]["task"] == "jobs.outbox_relay"
        for raw in client.lrange(RELAY_QUEUE, 0, -1)
    )


def test_a_burst_of_wakeups_sends_one_relay_task(broker: Any) -> None:
    for _ in range(50):
        relay_wake()
    assert relay_messages(broker) == 1


def test_a_finished_relay_lets_the_next_wakeup_through(broker: Any, db: Any) -> None:
    relay_wake()
    outbox_relay.run()  # drains nothing, finds no commit since it started
    relay_wake()
    assert relay_messages(broker) == 2


def test_a_commit_during_the_drain_gets_a_follow_up_relay(
    broker: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drain_while_a_commit_lands(**kwargs: Any) -> BatchReport:
        relay_wake()  # what the on-commit hook of a step does meanwhile
        return BatchReport()

    relay_wake()
    monkeypatch.setattr(jobs.relay, "outbox_drain", drain_while_a_commit_lands)
    outbox_relay.run()
    # The wake-up during the drain sent nothing itself; the relay queued its follow-up.
    assert relay_messages(broker) == 2
    follow_up = json.loads(broker.lindex(RELAY_QUEUE, 0))  # the newest message
    assert follow_up["headers"]["eta"] is not None
    # The follow-up holds the slot: more commits add no task.
    relay_wake()
    assert relay_messages(broker) == 2


def test_a_drain_stopped_by_its_time_budget_hands_on_at_once(
    broker: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drain_until_the_budget(**kwargs: Any) -> BatchReport:
        assert kwargs["max_seconds"] > 0  # a relay task never drains without a bound
        return BatchReport(published=500, more=True)

    relay_wake()
    broker.delete(RELAY_QUEUE)  # the message this relay task came from
    monkeypatch.setattr(jobs.relay, "outbox_drain", drain_until_the_budget)
    outbox_relay.run()
    # No commit came meanwhile, yet rows are left: the next relay starts without delay.
    assert relay_messages(broker) == 1
    assert json.loads(broker.lindex(RELAY_QUEUE, 0))["headers"]["eta"] is None


def test_a_runs_events_commit_announces_them_and_wakes_the_relay_once(
    broker: Any, transactional_db: Any
) -> None:
    from django.db import transaction

    from jobs.relay import run_channel
    from runs.models import Run
    from runs.timeline import PendingEvent, events_record
    from tests.factories import TaskFactory

    task = TaskFactory()
    run = Run.objects.create(task=task, run_no=1)
    listener = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    listener.subscribe(run_channel(run.id))
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    for _ in range(2):  # the second commit finds the relay scheduled: still announced
        with transaction.atomic():
            events_record(task=task, run=run, events=[PendingEvent("agent.run.started", {})])
        message = listener.get_message(timeout=5)
        assert json.loads(message["data"]) == {
            "run_id": str(run.id),
            "sequence": run.last_sequence_no,
        }
    listener.close()
    assert relay_messages(broker) == 1


def test_a_relay_under_load_leaves_what_came_meanwhile_to_its_follow_up(
    broker: Any, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain stops once a batch is not full: a relay that went on took the few rows
    each commit left meanwhile, paying a batch's round trips for each."""
    import functools

    from django.db import transaction

    from jobs.models import OutboxEvent
    from runs.models import Run
    from runs.timeline import PendingEvent, events_record
    from tests.factories import TaskFactory

    runs = [Run.objects.create(task=TaskFactory(), run_no=1) for _ in range(3)]

    def commit(run: Run, n: int) -> None:
        with transaction.atomic():
            events_record(
                task=run.task, run=run, events=[PendingEvent("agent.run.started", {})] * n
            )

    real = jobs.relay.outbox_relay_batch
    batches: list[int] = []

    def batch_then_a_commit_lands() -> BatchReport:
        report = functools.partial(real, limit=2)()
        batches.append(report.claimed)
        if len(batches) == 3:
            commit(runs[2], 2)  # a step of another run commits while the drain catches up
        return report

    commit(runs[0], 3)
    commit(runs[1], 2)  # its wake-up found the relay scheduled by the first
    assert relay_messages(broker) == 1
    broker.delete(RELAY_QUEUE)  # the message this relay task came from
    monkeypatch.setattr(jobs.relay, "outbox_relay_batch", batch_then_a_commit_lands)
    outbox_relay.run()
    # Full batches go on (2, 2); the third was not full (1): the rows committed meanwhile
    # are left pending, and the relay queued its follow-up after the coalescing window.
    assert batches == [2, 2, 1]
    pending = OutboxEvent.objects.filter(published_at__isnull=True)
    assert pending.count() == 2
    assert set(pending.values_list("partition_key", flat=True)) == {str(runs[2].pk)}
    assert relay_messages(broker) == 1
    assert json.loads(broker.lindex(RELAY_QUEUE, 0))["headers"]["eta"] is not None
    broker.delete(RELAY_QUEUE)
    outbox_relay.run()  # the follow-up
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert batches[3:] == [2, 0]  # a full batch, then one that found nothing left
