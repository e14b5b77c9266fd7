"""In-app consumers take the events of a relay batch in one work item (one wake-up).

Per (consumer, event) the side effect still happens exactly once, in commit order per
partition within a batch, and a batch whose wake-up is lost is still delivered by the
work sweep. A failing event is handed to single-event items so it cannot hold back the
events after it.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import defaultdict
from typing import Any

import pytest
import redis
from django.db import transaction

from jobs.consumers import Completion, Consumer, Event, event_consume
from jobs.models import DeadLetter, ProcessedEvent, WorkItem
from jobs.relay import outbox_drain
from jobs.work import (
    WorkDeferred,
    WorkKind,
    work_enqueue,
    work_kind,
    work_kind_register,
    work_sweep,
)
from jobs.work_execution import work_execute
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

# (run id, turn_no) per side effect, in the order the completions ran.
seen: list[tuple[str, int]] = []
fail_turn: dict[str, int] = {}
# run id -> (turn_no, seconds): that turn is deferred (someone else holds its side effect).
defer_turn: dict[str, tuple[int, float]] = {}


def record(event: Event) -> Completion:
    if fail_turn.get(str(event.run_id)) == event.data["turn_no"]:
        raise RuntimeError("this turn cannot be handled yet")
    turn, seconds = defer_turn.get(str(event.run_id), (0, 0.0))
    if turn == event.data["turn_no"]:
        raise WorkDeferred("another sender holds this turn", seconds=seconds)

    def write() -> None:
        seen.append((str(event.run_id), int(event.data["turn_no"])))

    return write


RECORDER = Consumer(name="recorder", types=("agent.model.turn.completed",), handle=record)


@pytest.fixture(autouse=True)
def recorder(settings: Any) -> Any:
    name = f"test_batches.{uuid.uuid4().hex}"
    settings.EVENT_STREAM_NAME = name
    settings.EVENT_CONSUMERS = ["tests.jobs.test_consumer_batches.RECORDER"]
    seen.clear()
    fail_turn.clear()
    defer_turn.clear()
    yield
    redis.Redis.from_url(settings.REDIS_URL).delete(name)


def _interleaved(workspace: Any, runs: int, turns: int) -> list[str]:
    """Commit ``turns`` model turns of each of ``runs`` runs, interleaved; the run ids."""
    pairs = []
    for _ in range(runs):
        task = TaskFactory(workspace=workspace)
        pairs.append((task, Run.objects.create(task=task, run_no=1)))
    for n in range(1, turns + 1):
        for task, run in pairs:
            with transaction.atomic():
                events_record(
                    task=task,
                    run=run,
                    events=[PendingEvent("agent.model.turn.completed", {"turn_no": n})],
                )
    return [str(run.id) for _, run in pairs]


def _per_run(seen: list[tuple[str, int]]) -> dict[str, list[int]]:
    order: dict[str, list[int]] = defaultdict(list)
    for run_id, turn in seen:
        order[run_id].append(turn)
    return dict(order)


def _items() -> list[WorkItem]:
    return list(WorkItem.objects.filter(kind="event.consume").order_by("pk"))


def test_one_item_per_consumer_and_batch_in_commit_order_per_partition(workspace):
    run_ids = _interleaved(workspace, runs=3, turns=4)
    assert outbox_drain().published == 12

    (item,) = _items()
    assert len(item.args["event_ids"]) == 12
    assert work_execute(item_id=item.pk) == "done"
    assert _per_run(seen) == {run_id: [1, 2, 3, 4] for run_id in run_ids}
    assert ProcessedEvent.objects.filter(consumer="recorder").count() == 12


def test_duplicate_wakeups_and_overlapping_items_apply_each_event_once(workspace):
    _interleaved(workspace, runs=2, turns=3)
    outbox_drain()
    (item,) = _items()
    ids = item.args["event_ids"]

    # One event alone first (a replay), then the batch twice (a redelivered wake-up whose
    # first run had finished, and one whose claim the lease did not stop).
    assert event_consume(consumer="recorder", event_id=ids[2]) == "processed"
    assert work_execute(item_id=item.pk) == "done"
    assert event_consume(consumer="recorder", event_ids=ids) == "processed"
    assert work_execute(item_id=item.pk) == "done"  # already done: not run again

    assert len(seen) == len(ids) == 6
    assert len(set(seen)) == 6
    assert ProcessedEvent.objects.filter(consumer="recorder").count() == 6


def test_a_lost_wakeup_of_a_batch_is_delivered_by_the_sweep(workspace, own_redis, broker_at):
    broker_at(own_redis.url)
    _interleaved(workspace, runs=2, turns=2)
    outbox_drain()
    (item,) = _items()
    broker = redis.Redis.from_url(own_redis.url)
    assert broker.llen("events") == 1  # one wake-up for the whole batch
    broker.delete("events")  # the message is lost with the broker

    WorkItem.objects.filter(pk=item.pk).update(
        woken_at=item.created_at.replace(year=2000), created_at=item.created_at.replace(year=2000)
    )
    assert work_sweep().woken == 1
    (raw,) = broker.lrange("events", 0, -1)
    message = json.loads(raw)
    assert message["headers"]["task"] == "jobs.work"
    (item_id,) = json.loads(base64.b64decode(message["body"]))[0]
    assert work_execute(item_id=item_id) == "done"  # what the woken worker runs
    assert len(seen) == 4
    assert ProcessedEvent.objects.filter(consumer="recorder").count() == 4


def test_a_failing_event_is_split_off_and_does_not_hold_back_the_rest(workspace):
    (run_id,) = _interleaved(workspace, runs=1, turns=5)
    fail_turn[run_id] = 3
    outbox_drain()
    (batch,) = _items()
    ids = batch.args["event_ids"]

    assert work_execute(item_id=batch.pk) == "done"
    assert seen == [(run_id, 1), (run_id, 2)]
    singles = {i.args["event_id"]: i for i in _items() if i.pk != batch.pk}
    assert sorted(singles) == sorted(ids[2:])
    assert singles[ids[2]].due_at > singles[ids[3]].due_at  # the failed one waits to retry

    for event_id in ids[3:]:
        assert work_execute(item_id=singles[event_id].pk) == "done"
    assert [turn for _, turn in seen] == [1, 2, 4, 5]
    fail_turn.clear()
    WorkItem.objects.filter(pk=singles[ids[2]].pk).update(due_at=batch.created_at)
    assert work_execute(item_id=singles[ids[2]].pk) == "done"
    assert sorted(turn for _, turn in seen) == [1, 2, 3, 4, 5]
    assert ProcessedEvent.objects.filter(consumer="recorder").count() == 5


def test_a_deferred_event_waits_as_long_as_it_was_told_without_spending_attempts(workspace):
    (run_id,) = _interleaved(workspace, runs=1, turns=3)
    defer_turn[run_id] = (2, 600.0)
    outbox_drain()
    (batch,) = _items()
    ids = batch.args["event_ids"]

    assert work_execute(item_id=batch.pk) == "done"
    singles = {i.args["event_id"]: i for i in _items() if i.pk != batch.pk}
    waiting = singles[ids[1]]
    # Due when the wait ends (not after the retry base of 2 s); the event after it goes on.
    assert (waiting.due_at - batch.created_at).total_seconds() > 590
    assert work_execute(item_id=singles[ids[2]].pk) == "done"

    # Run again while still told to wait: pending, the attempt given back, due later.
    for _ in range(10):
        WorkItem.objects.filter(pk=waiting.pk).update(due_at=batch.created_at)
        assert work_execute(item_id=waiting.pk) == "deferred"
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts, waiting.claim) == (WorkItem.Status.PENDING, 0, "")
    assert "WorkDeferred" in waiting.last_error
    assert (waiting.due_at - batch.created_at).total_seconds() > 590

    defer_turn.clear()
    WorkItem.objects.filter(pk=waiting.pk).update(due_at=batch.created_at)
    assert work_execute(item_id=waiting.pk) == "done"
    assert sorted(turn for _, turn in seen) == [1, 2, 3]


def always_deferred() -> None:
    raise WorkDeferred("the holder never lets go", seconds=30.0)


def test_work_that_never_stops_deferring_ends_as_a_dead_letter(workspace):
    name = f"test.always_deferred.{uuid.uuid4().hex[:8]}"
    work_kind_register(
        WorkKind(name=name, handler=always_deferred, max_attempts=2, max_deferrals=3)
    )
    assert work_kind(name).max_deferrals == 3
    with transaction.atomic():
        item = work_enqueue(kind=name, key="k", args={})
    outcomes = []
    for _ in range(8):
        WorkItem.objects.filter(pk=item.pk).update(due_at=item.created_at)
        outcomes.append(work_execute(item_id=item.pk))
        item.refresh_from_db()
        if item.status != WorkItem.Status.PENDING:
            break
        # Every wait is the one the deferral named, the retries' included (not 2 s).
        assert (item.due_at - item.created_at).total_seconds() > 25
    # Three deferrals give back their attempt; the ones after them spend it, as failures.
    assert outcomes == ["deferred"] * 3 + ["retry", "dead"]
    assert (item.status, item.deferrals, item.attempts) == (WorkItem.Status.DEAD, 3, 2)
    (letter,) = DeadLetter.objects.filter(task_name=name)
    assert "WorkDeferred" in letter.exception


def test_a_batch_whose_worker_died_is_split_so_a_poison_event_dies_alone(workspace):
    _interleaved(workspace, runs=1, turns=4)
    outbox_drain()
    (batch,) = _items()
    ids = batch.args["event_ids"]
    assert event_consume(consumer="recorder", event_id=ids[0]) == "processed"
    # A worker claimed the batch and died with it (its lease ran out, never released).
    WorkItem.objects.filter(pk=batch.pk).update(
        lease_until=batch.created_at.replace(year=2000), claim="dead-worker", attempts=1
    )

    assert work_execute(item_id=batch.pk) == "done"
    assert [turn for _, turn in seen] == [1]  # the batch itself ran nothing this time
    singles = [i for i in _items() if i.pk != batch.pk]
    assert sorted(i.args["event_id"] for i in singles) == sorted(ids[1:])
    for item in singles:
        assert work_execute(item_id=item.pk) == "done"
    assert sorted(turn for _, turn in seen) == [1, 2, 3, 4]
    assert ProcessedEvent.objects.filter(consumer="recorder").count() == 4
