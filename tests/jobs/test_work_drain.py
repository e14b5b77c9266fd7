"""New work items are woken per queue: one drain task runs what any number of commits
created, and whatever a drain misses is still pending for the next one or the sweep.

Real Redis for the coalescing keys and the broker's queues (a queue of the test's own,
so no worker takes its messages), real PostgreSQL for the claims.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

import jobs.work_execution
from jobs.models import DeadLetter, WorkItem
from jobs.work import (
    WORK_DRAIN_TASK,
    WorkKind,
    work_enqueue_new,
    work_kind_register,
    work_wake_new,
    work_wake_reset,
)
from jobs.work_execution import work_drain, work_execute
from tests.conftest import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

RAN: list[str] = []


def _record(name: str, pause: float = 0.0) -> None:
    if pause:
        time.sleep(pause)
    RAN.append(name)


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue no worker consumes, and a kind of work on it."""
    name = f"drain-test-{uuid.uuid4().hex[:8]}"
    work_kind_register(WorkKind(name=name, handler=_record, queue=name))
    RAN.clear()
    work_wake_reset()
    yield name
    broker().delete(name)
    work_wake_reset()


def broker() -> Any:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def messages(queue: str) -> list[tuple[str, list[Any]]]:
    """The tasks queued on ``queue``, oldest first: (name, args)."""
    found = []
    for raw in reversed(broker().lrange(queue, 0, -1)):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], body[0]))
    return found


def create(queue: str, *names: str) -> list[int]:
    """Items created as a webhook delivery creates its own: each in its own commit."""
    ids = []
    for name in names:
        with transaction.atomic():
            ids.append(work_enqueue_new(kind=queue, key=name, args={"name": name}).pk)
    return ids


def test_a_burst_of_new_items_sends_one_drain_which_runs_them_all(queue: str) -> None:
    names = [f"item-{n}" for n in range(20)]
    create(queue, *names)
    assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0])]

    report = work_drain(queue=queue, slot=0)

    assert (report.done, report.more, report.outcomes) == (20, False, {"done": 20})
    assert names == RAN  # oldest first
    assert set(WorkItem.objects.filter(kind=queue).values_list("status", flat=True)) == {"done"}
    # The finished drain freed its slot: the next new item sends a drain again.
    create(queue, "later")
    assert [name for name, _ in messages(queue)] == [WORK_DRAIN_TASK] * 2


def test_an_item_committed_after_the_last_claim_gets_a_drain_of_its_own(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(queue, "first")
    broker().delete(queue)
    claim = jobs.work_execution._claim_next
    late: list[int] = []

    def claim_then_commit_late(name: str) -> Any:
        item = claim(name)
        if item is None and not late:
            # Its wake-up finds slot 0 still held by this drain and sends nothing.
            late.extend(create(queue, "late"))
            assert messages(queue) == []
        return item

    monkeypatch.setattr(jobs.work_execution, "_claim_next", claim_then_commit_late)
    assert work_drain(queue=queue).done == 1

    assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0])]
    assert WorkItem.objects.get(pk=late[0]).status == WorkItem.Status.PENDING
    monkeypatch.setattr(jobs.work_execution, "_claim_next", claim)
    assert work_drain(queue=queue).done == 1
    assert RAN == ["first", "late"]


def test_a_drain_out_of_time_hands_on_and_starts_a_helper(queue: str, settings: Any) -> None:
    work_kind_register(WorkKind(name=queue, handler=lambda name: _record(name, 0.05), queue=queue))
    create(queue, *(f"item-{n}" for n in range(6)))
    broker().delete(queue)

    report = work_drain(queue=queue, slot=0, seconds=0.01)

    assert (report.done, report.more) == (1, True)
    # The same slot goes on, and slot 1 joins while the backlog lasts.
    assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0]), (WORK_DRAIN_TASK, [queue, 1])]
    helper = work_drain(queue=queue, slot=1, seconds=0.01)
    assert helper.more
    # With WORK_DRAIN_PARALLEL=3, slot 2 goes on alone: there is no slot 3.
    settings.WORK_DRAIN_PARALLEL = 3
    assert messages(queue)[-2:] == [(WORK_DRAIN_TASK, [queue, 1]), (WORK_DRAIN_TASK, [queue, 2])]
    work_drain(queue=queue, slot=2, seconds=0.01)
    assert messages(queue)[-1] == (WORK_DRAIN_TASK, [queue, 2])
    assert (WORK_DRAIN_TASK, [queue, 3]) not in messages(queue)
    rest = work_drain(queue=queue, slot=0)
    assert (rest.done, rest.more) == (3, False)
    assert sorted(RAN) == [f"item-{n}" for n in range(6)]


def test_a_drain_leaves_items_held_early_elsewhere_or_about_to_turn_poison(
    queue: str, settings: Any
) -> None:
    settings.WORK_POISON_CRASHES = 3
    held, early, poison, crashed = create(queue, "held", "early", "poison", "crashed")
    now = timezone.now()
    WorkItem.objects.filter(pk=held).update(lease_until=now + timedelta(minutes=5), claim="x")
    WorkItem.objects.filter(pk=early).update(due_at=now + timedelta(minutes=5))
    # Two deaths counted and a third left behind (an expired lease): the next claim
    # would make it poison, which only the item's own wake-up decides, under its lock.
    WorkItem.objects.filter(pk=poison).update(
        crashes=2, lease_until=now - timedelta(seconds=1), claim="dead"
    )
    WorkItem.objects.filter(pk=crashed).update(lease_until=now - timedelta(seconds=1), claim="dead")

    report = work_drain(queue=queue)

    assert RAN == ["crashed"]
    assert report.done == 1
    item = WorkItem.objects.get(pk=crashed)
    assert (item.status, item.crashes, item.attempts) == ("done", 1, 1)
    statuses = dict(WorkItem.objects.filter(kind=queue).values_list("key", "status"))
    assert statuses == {
        "held": "pending",
        "early": "pending",
        "poison": "pending",
        "crashed": "done",
    }
    assert work_execute(item_id=poison) == "poison"
    assert DeadLetter.objects.filter(task_id=f"work:{poison}").exists()


def test_a_drain_runs_only_its_own_queue(queue: str) -> None:
    other = f"{queue}-other"
    work_kind_register(WorkKind(name=other, handler=_record, queue=other))
    try:
        create(other, "theirs")
        create(queue, "ours")
        assert work_drain(queue=queue).done == 1
        assert RAN == ["ours"]
        assert WorkItem.objects.get(kind=other).status == WorkItem.Status.PENDING
    finally:
        broker().delete(other)


def test_without_its_redis_a_wakeup_still_sends_a_drain(queue: str, settings: Any) -> None:
    # Nothing listens here: the coalescing keys cannot be written.
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    create(queue, "a", "b")
    assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0])] * 2
    assert work_drain(queue=queue).done == 2


def test_a_refused_send_frees_the_slot_and_leaves_the_items_pending(
    queue: str, broker_at: Any
) -> None:
    broker_at(f"redis://127.0.0.1:{free_port()}/0")  # every send is refused
    (item,) = create(queue, "a")
    assert WorkItem.objects.get(pk=item).status == WorkItem.Status.PENDING
    broker_at(None)
    create(queue, "b")  # slot 0 was given back: this wake-up is sent
    assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0])]


def test_work_wake_new_wakes_several_queues_in_one_round_trip(queue: str) -> None:
    other = f"{queue}-other"
    try:
        assert work_wake_new(queue, other) == 2
        assert work_wake_new(queue, other) == 0  # both drains are still queued
        assert messages(queue) == [(WORK_DRAIN_TASK, [queue, 0])]
        assert messages(other) == [(WORK_DRAIN_TASK, [other, 0])]
    finally:
        broker().delete(other)
