"""Consumer replay: recorded events re-delivered to one consumer, each applied once."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.consumers import Consumer
from jobs.models import EventSubscription, OutboxEvent, ProcessedEvent, WorkspaceDailyCost
from jobs.redelivery import outbox_envelopes, redeliver, redelivery_count
from runs import demo
from runs.engine import run_drive_inline
from runs.models import RunEvent
from runs.replay.redeliver import timeline_envelopes
from runs.services import task_submit
from runs.timeline import event_record

pytestmark = pytest.mark.django_db(transaction=True)

APPLIED: list[str] = []


def _handle(event):
    return lambda: APPLIED.append(event.id)


COUNTER = Consumer(name="test-counter", types=("agent.*",), handle=_handle)


@pytest.fixture(autouse=True)
def counter_registered(settings):
    APPLIED.clear()
    settings.EVENT_CONSUMERS = [*settings.EVENT_CONSUMERS, f"{__name__}.COUNTER"]


def test_replay_of_1000_events_applies_the_unseen_half_exactly_once(run):
    ids = [uuid.uuid4() for _ in range(1000)]
    OutboxEvent.objects.bulk_create(
        OutboxEvent(
            event_id=event_id,
            type="agent.tool.call.completed",
            partition_key=str(run.id),
            payload={
                "specversion": "1.0",
                "id": str(event_id),
                "type": "agent.tool.call.completed",
            },
        )
        for event_id in ids
    )
    ProcessedEvent.objects.bulk_create(
        ProcessedEvent(consumer="test-counter", event_id=event_id) for event_id in ids[::2]
    )

    dry = redelivery_count(
        target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id))
    )
    assert (dry.events, dry.already_processed, dry.to_deliver) == (1000, 500, 500)
    assert APPLIED == []

    report = redeliver(target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id)))
    again = redeliver(target="test-counter", envelopes=outbox_envelopes(partition_key=str(run.id)))

    assert report.delivered == 500 and again.delivered == 0 and not report.failed
    assert [str(e) for e in ids[1::2]] == APPLIED  # the unseen half, in order, once each
    assert ProcessedEvent.objects.filter(consumer="test-counter").count() == 1000


def test_a_new_consumer_is_backfilled_from_the_timeline_after_the_outbox_is_pruned(run):

    with transaction.atomic():
        recorded = [
            event_record(
                task=run.task,
                run=run,
                type="agent.run.operator_action",
                data={"action": "x", "by": "t"},
            )
            for _ in range(3)
        ]
    OutboxEvent.objects.all().delete()

    report = redeliver(target="test-counter", envelopes=timeline_envelopes(run_id=run.id))

    assert report.delivered == 3
    assert [str(e.id) for e in recorded] == APPLIED


class _Receiver:
    """A subscriber endpoint in a thread that records each delivery's event id."""

    def __init__(self) -> None:

        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append(self.headers["X-Agentplatform-Delivery"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_subscription_is_redelivered_a_time_range_of_a_workspace_once(run):

    receiver = _Receiver()
    try:
        sub = EventSubscription.objects.create(
            workspace_id=run.workspace_id,
            url=receiver.url,
            secret="s3cret-value",
            event_types=["agent.run.*"],
        )
        with transaction.atomic():
            old, new = (
                event_record(
                    task=run.task,
                    run=run,
                    type="agent.run.operator_action",
                    data={"action": a, "by": "t"},
                )
                for a in ("old", "new")
            )
        RunEvent.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
        since = timezone.now() - timedelta(days=1)
        envelopes = lambda: timeline_envelopes(workspace_id=run.workspace_id, since=since)  # noqa: E731

        dry = redelivery_count(target=f"subscription:{sub.pk}", envelopes=envelopes())
        first = redeliver(target=f"subscription:{sub.pk}", envelopes=envelopes())
        second = redeliver(target=f"subscription:{sub.pk}", envelopes=envelopes())
    finally:
        receiver.close()

    assert dry.to_deliver == 1 and receiver.received == [str(new.id)]
    assert (first.delivered, second.delivered, second.already_processed) == (1, 0, 1)


def test_the_cost_consumer_is_backfilled_from_a_run_timeline_exactly_once(
    workspace, repository, monkeypatch
):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)
    assert not WorkspaceDailyCost.objects.exists()  # no relay ran: the consumer saw nothing

    for _ in range(2):
        report = redeliver(target="cost_aggregation", envelopes=timeline_envelopes(run_id=run.id))

    totals = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert report.delivered == 0 and report.already_processed == totals.model_turns
    assert (totals.tokens_in, totals.tokens_out) == (run.tokens_in, run.tokens_out)
    assert totals.model_turns == run.model_turns.count()
    assert totals.cost_usd == run.cost_usd
