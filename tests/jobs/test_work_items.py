"""Work that is not a run step lives in a row: a lost wake-up loses nothing but time.

Each test produces the fault for real: a broker that refuses the send, a Redis (the
test's own) restarted without persistence under a backlog, a handler that kills its
worker process.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.consumers import Consumer, Event
from jobs.models import DeadLetter, OutboxEvent, ProcessedEvent, WorkItem, WorkspaceDailyCost
from jobs.relay import outbox_drain
from jobs.services import dead_letter_requeue
from jobs.work import work_sweep
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.conftest import free_port, wait_for
from tests.factories import TaskFactory
from tests.webhooks.test_webhook_support import CORPUS, GITHUB_SECRET, github_post
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def slow(event: Event) -> None:
    """Blocks while the file named by SLOW_FLAG exists (at most 20 s)."""
    deadline = time.monotonic() + 20
    while Path(os.environ["SLOW_FLAG"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def killer(event: Event) -> None:
    """Kills the worker process running it, as an out-of-memory kill would."""
    os.kill(os.getpid(), signal.SIGKILL)


PING = json.loads((CORPUS / "github" / "ping" / "payload.json").read_text())
SLOW = Consumer(name="slow", types=("agent.model.turn.completed",), handle=slow)
KILLER = Consumer(name="killer", types=("agent.model.turn.completed",), handle=killer)


def _turns(workspace, count: int, *, one_batch_each: bool = False) -> list[str]:
    """Record ``count`` model turns in one commit; ``one_batch_each``: one commit and one
    relay batch per turn, so each consumer gets one work item (one message) per event."""
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    turns = [
        PendingEvent(
            "agent.model.turn.completed",
            {"turn_no": n, "tokens_in": 1, "tokens_out": 1, "cost_usd": "0.01"},
        )
        for n in range(1, count + 1)
    ]
    for group in [[t] for t in turns] if one_batch_each else [turns]:
        with transaction.atomic():
            events_record(task=task, run=run, events=group)
        if one_batch_each:
            outbox_drain()
            # A worker's relay may hold the row: wait until it is published either way.
            wait_for(
                lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(),
                message="turn published",
            )
    return [
        str(e)
        for e in OutboxEvent.objects.filter(type="agent.model.turn.completed").values_list(
            "event_id", flat=True
        )
    ]


def _sweep_until(predicate, *, timeout: float, message: str):
    """Run the work sweep as beat would (every 0.5 s here) until ``predicate`` holds."""

    def swept():
        work_sweep()
        return predicate()

    return wait_for(swept, timeout=timeout, interval=0.5, message=message)


def test_webhook_is_processed_although_the_broker_refused_its_wakeup(
    client, settings, start_worker, broker_at
):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    start_worker("hooks", queues="webhooks", concurrency=1)
    # Nothing listens on this port: every send is refused.
    broker_at(f"redis://127.0.0.1:{free_port()}/0")
    response = github_post(client, PING, "ping")
    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    item = WorkItem.objects.get(kind="webhook.process", key=str(receipt.pk))
    assert (item.status, item.woken_at) == (WorkItem.Status.PENDING, None)

    # GitHub redelivers: still a duplicate, and still nothing lost.
    again = github_post(client, PING, "ping", delivery=receipt.delivery_id)
    assert again.status_code == 200

    broker_at(None)
    _sweep_until(
        lambda: WebhookReceipt.objects.filter(
            pk=receipt.pk, status__in=["processed", "ignored"]
        ).exists(),
        timeout=30,
        message="receipt processed after the sweep",
    )
    item.refresh_from_db()
    assert (item.status, item.attempts) == (WorkItem.Status.DONE, 1)


def test_consumer_backlog_survives_a_restart_of_its_redis_and_so_does_the_worker(
    settings, workspace, start_worker, own_redis, broker_at, monkeypatch, tmp_path
):
    flag = tmp_path / "slow"
    flag.touch()
    stream = f"test_work.{uuid.uuid4().hex}"
    monkeypatch.setenv("SLOW_FLAG", str(flag))
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    consumers = "runs.cost_aggregation.COST_AGGREGATION,tests.jobs.test_work_items.SLOW"
    monkeypatch.setenv("EVENT_CONSUMERS", consumers)
    settings.EVENT_CONSUMERS = consumers.split(",")
    monkeypatch.setenv("CELERY_BROKER_URL", own_redis.url)
    # Longer than the slow handler: the in-flight item is not taken twice meanwhile.
    monkeypatch.setenv("WORK_LEASE_SECONDS", "30")
    broker_at(own_redis.url)
    worker = start_worker("events", queues="events", concurrency=1)
    event_ids = _turns(workspace, 8, one_batch_each=True)
    outbox_drain()
    items = WorkItem.objects.filter(kind="event.consume")
    assert items.count() == 16
    # One message is running (blocked in the slow handler); the rest wait in Redis.
    wait_for(lambda: items.filter(lease_until__isnull=False).exists(), message="one in flight")
    client = redis.Redis.from_url(own_redis.url)
    assert client.llen("events") >= 10

    own_redis.restart()
    assert client.llen("events") == 0  # the backlog died with Redis
    flag.unlink()
    time.sleep(3)  # the worker reconnects (with backoff) instead of exiting
    assert worker.process.poll() is None, worker.output()[-3000:]

    # An item is marked done after its handler's receipt commits: wait for both.
    _sweep_until(
        lambda: (
            ProcessedEvent.objects.filter(event_id__in=event_ids).count() == 16
            and not items.exclude(status=WorkItem.Status.DONE).exists()
        ),
        timeout=60,
        message="every delivery consumed after the restart",
    )
    assert worker.process.poll() is None
    assert "Unrecoverable error" not in worker.output()
    cost = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert cost.model_turns == 8
    assert not items.exclude(status=WorkItem.Status.DONE).exists()
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)


def test_a_handler_that_kills_its_worker_is_dead_lettered_as_poison(
    settings, workspace, start_worker, monkeypatch
):
    stream = f"test_work.{uuid.uuid4().hex}"
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    consumers = "runs.cost_aggregation.COST_AGGREGATION,tests.jobs.test_work_items.KILLER"
    monkeypatch.setenv("EVENT_CONSUMERS", consumers)
    settings.EVENT_CONSUMERS = consumers.split(",")
    worker = start_worker("poison", queues="events", concurrency=1)
    (event_id,) = _turns(workspace, 1)
    outbox_drain()
    # The worker's own relay (it serves the events queue) may have claimed the event
    # first: its work items then appear once that relay has published it.
    item = wait_for(
        lambda: WorkItem.objects.filter(kind="event.consume", key=f"killer:{event_id}").first(),
        message="the killer's work item",
    )

    letter = _sweep_until(
        lambda: DeadLetter.objects.filter(task_id=f"work:{item.pk}").first(),
        timeout=60,
        message="poison dead-lettered",
    )
    item.refresh_from_db()
    assert item.status == WorkItem.Status.DEAD
    assert item.crashes == settings.WORK_POISON_CRASHES
    assert item.attempts == settings.WORK_POISON_CRASHES  # it ran (and killed) 3 times
    assert f"killed its worker {settings.WORK_POISON_CRASHES} times" in letter.exception
    assert letter.workspace_id == workspace.pk
    # The healthy consumer of the same event was not held up; the worker lives on.
    wait_for(
        lambda: WorkspaceDailyCost.objects.filter(workspace_id=workspace.pk).exists(),
        message="cost aggregated",
    )
    assert worker.process.poll() is None
    # Nothing keeps re-sending the dead item.
    assert work_sweep().woken == 0
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)


def test_requeue_refused_by_the_broker_still_runs_once_the_sweep_wakes_it(
    workspace, start_worker, broker_at, monkeypatch
):
    stream = f"test_work.{uuid.uuid4().hex}"
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    (event_id,) = _turns(workspace, 1)
    outbox_drain()
    item = WorkItem.objects.get(kind="event.consume", key=f"cost_aggregation:{event_id}")
    WorkItem.objects.filter(pk=item.pk).update(status=WorkItem.Status.DEAD)
    letter = DeadLetter.objects.create(
        task_name="event.consume",
        task_id=f"work:{item.pk}",
        kwargs=item.args,
        exception="RuntimeError: boom",
        first_failed_at=item.created_at,
        last_failed_at=item.created_at,
    )
    broker_at(f"redis://127.0.0.1:{free_port()}/0")
    assert dead_letter_requeue(letter=letter, by="operator")
    assert not dead_letter_requeue(letter=letter, by="operator")
    broker_at(None)
    start_worker("requeue", queues="events", concurrency=1)

    _sweep_until(
        lambda: ProcessedEvent.objects.filter(
            consumer="cost_aggregation", event_id=event_id
        ).exists(),
        timeout=30,
        message="requeued delivery consumed",
    )
    assert WorkspaceDailyCost.objects.get(workspace_id=workspace.pk).model_turns == 1
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)


def test_sweep_does_not_multiply_wakeups_of_a_backlog(workspace, monkeypatch, own_redis, broker_at):
    """No worker: every tick may only re-send what is overdue, with growing intervals."""
    broker_at(own_redis.url)
    stream = f"test_work.{uuid.uuid4().hex}"
    monkeypatch.setenv("EVENT_STREAM_NAME", stream)
    _turns(workspace, 5, one_batch_each=True)  # five wake-ups sent on commit
    # As if the five had been created and woken together (one relay batch each is slower).
    WorkItem.objects.update(created_at=timezone.now(), woken_at=timezone.now())
    sent = [work_sweep().woken for _ in range(5)]
    assert sent == [0, 0, 0, 0, 0]  # all were just woken: nothing is overdue yet
    WorkItem.objects.update(woken_at=WorkItem.objects.first().created_at.replace(year=2000))
    assert work_sweep().woken == 5
    assert work_sweep().woken == 0
    assert sorted(WorkItem.objects.values_list("wakes", flat=True)) == [2] * 5
    queued = [
        json.loads(raw)["headers"]["task"]
        for raw in redis.Redis.from_url(own_redis.url).lrange("events", 0, -1)
    ]
    assert queued.count("jobs.work") == 10  # five on commit, five by one overdue sweep
    redis.Redis.from_url(settings.REDIS_URL).delete(stream)
