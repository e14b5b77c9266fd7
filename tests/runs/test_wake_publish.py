"""A run's wake-up goes out through Celery's own publish once its state commits, and
kombu's Redis transport hands the most urgent step out first (docs/design.md Decisions,
"Priorities, fair shares and dispatch order")."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.db import transaction
from kombu import Connection

from agentplatform.celery import app
from runs import fairness
from runs.dispatch import run_wake, run_wake_on_commit
from tests.conftest import queue_lists
from tests.factories import RunFactory, TaskFactory, WorkspaceFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def _run(priority: int, workspace: Any) -> Any:
    return RunFactory(task=TaskFactory(workspace=workspace, priority=priority))


def _taken(url: str, queue: str, count: int) -> list[list[Any]]:
    """The arguments of ``count`` messages in the order kombu's own consumer takes them."""
    options = app.conf.broker_transport_options
    taken = []
    with Connection(url, transport_options=options) as connection:
        simple = connection.SimpleQueue(queue)
        for _ in range(count):
            message = simple.get(timeout=5)
            assert message.headers["task"] == "runs.step"
            taken.append(message.payload[0])
            message.ack()
        simple.close()
    return taken


def test_wake_ups_are_taken_most_urgent_first(own_redis, broker_at) -> None:
    broker_at(own_redis.url)
    fairness.shares_forget()
    workspace = WorkspaceFactory()
    batch, normal, emergency = (_run(p, workspace) for p in (200, 100, 0))
    for run in (batch, normal, emergency):
        run_wake(run_id=run.pk, step_no=1)

    taken = _taken(own_redis.url, "agent", 3)

    assert taken == [[str(run.pk), 1] for run in (emergency, normal, batch)]


def test_a_wake_up_is_sent_only_when_its_transaction_commits(own_redis, broker_at) -> None:
    broker_at(own_redis.url)
    run = _run(100, WorkspaceFactory())
    with pytest.raises(RuntimeError), transaction.atomic():
        run_wake_on_commit(run_id=run.pk, step_no=1)
        raise RuntimeError("rolled back")
    with transaction.atomic():
        run_wake_on_commit(run_id=run.pk, step_no=2, status="verifying")

    assert _taken(own_redis.url, "verify", 1) == [[str(run.pk), 2]]
    client = redis.Redis.from_url(own_redis.url)
    assert sum(client.llen(name) for name in queue_lists("agent")) == 0
