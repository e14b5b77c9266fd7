"""Outgoing HTTP: a GitHub comment on the task's source, once per event and channel;
signed subscription deliveries, retried until accepted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.test import override_settings

from jobs.consumers import event_consume
from jobs.models import EventSubscription, Notification, OutboxEvent, ProcessedEvent
from jobs.subscriptions import DeliveryFailed, signature_verify, subscription_deliver
from runs.models import Run
from runs.notify import MARKER
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder(BaseHTTPRequestHandler):
    """A tiny GitHub issues-comments API and webhook receiver."""

    server: ThreadingHTTPServer

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(200, self.server.comments)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, dict(self.headers), body))
        if self.server.failures:
            self.server.failures -= 1
            self._reply(503, {"message": "try later"})
            return
        comment = {
            "id": len(self.server.comments) + 1,
            "body": json.loads(body).get("body"),
            "html_url": "https://github.test/c",
        }
        self.server.comments.append(comment)
        self._reply(201, comment)


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.comments, server.requests, server.failures = [], [], 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _completed(workspace, source_ref: dict) -> str:
    task = TaskFactory(workspace=workspace, source_ref=source_ref)
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(
            task=task, run=run, events=[PendingEvent("agent.task.completed", {"run_no": 1})]
        )
    return str(OutboxEvent.objects.get(type="agent.task.completed").event_id)


def test_completion_comment_is_posted_once_per_event(workspace, http_server):
    url = f"http://127.0.0.1:{http_server.server_port}"
    event_id = _completed(workspace, {"provider": "github", "repo": "octo/calc", "issue_number": 7})
    with override_settings(GITHUB_API_URL=url, GITHUB_TOKEN="ghs_secret"):
        assert event_consume(consumer="source_notification", event_id=event_id) == "processed"
        assert event_consume(consumer="source_notification", event_id=event_id) == "duplicate"

    ((path, headers, body),) = http_server.requests
    assert path == "/repos/octo/calc/issues/7/comments"
    assert headers["Authorization"] == "Bearer ghs_secret"
    assert MARKER.format(event_id=event_id) in json.loads(body)["body"]
    note = Notification.objects.get(event_id=event_id, channel="github_comment")
    assert (note.status, note.external_id) == (Notification.Status.SENT, "1")


def test_a_retry_after_a_lost_answer_finds_its_comment_instead_of_posting_again(
    workspace,
    http_server,
):
    url = f"http://127.0.0.1:{http_server.server_port}"
    event_id = _completed(workspace, {"provider": "github", "repo": "octo/calc", "issue_number": 7})
    # An earlier attempt posted, then died before recording it.
    Notification.objects.create(event_id=event_id, channel="github_comment", attempts=1)
    http_server.comments.append(
        {
            "id": 99,
            "html_url": "https://github.test/c99",
            "body": "done\n" + MARKER.format(event_id=event_id),
        }
    )
    with override_settings(GITHUB_API_URL=url):
        assert event_consume(consumer="source_notification", event_id=event_id) == "processed"

    assert http_server.requests == []
    assert Notification.objects.get(event_id=event_id).external_id == "99"


def test_subscription_delivery_is_signed_and_retried_until_accepted(workspace, http_server):
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(task=task, run=run, events=[PendingEvent("agent.run.started", {"run_no": 1})])
    event_id = str(OutboxEvent.objects.get(type="agent.run.started").event_id)
    sub = EventSubscription.objects.create(
        workspace_id=workspace.pk,
        url=f"http://127.0.0.1:{http_server.server_port}/hook",
        secret="s3cret",
        event_types=["agent.run.*"],
    )
    http_server.failures = 1

    with pytest.raises(DeliveryFailed):
        subscription_deliver(subscription_id=sub.pk, event_id=event_id)
    assert subscription_deliver(subscription_id=sub.pk, event_id=event_id) == "delivered"
    assert subscription_deliver(subscription_id=sub.pk, event_id=event_id) == "duplicate"

    assert len(http_server.requests) == 2
    _, headers, body = http_server.requests[-1]
    assert signature_verify(secret="s3cret", body=body, header=headers["X-Hub-Signature-256"])
    assert headers["X-Agentplatform-Delivery"] == event_id
    assert json.loads(body)["type"] == "agent.run.started"
    # The subscriber joins the event's trace with a span of its own.
    event_trace = json.loads(body)["traceparent"].split("-")
    sent_trace = headers["traceparent"].split("-")
    assert sent_trace[1] == event_trace[1] and sent_trace[2] != event_trace[2]
    assert ProcessedEvent.objects.filter(consumer=f"subscription:{sub.pk}").count() == 1
    assert sub.wants("agent.run.started") and not sub.wants("agent.task.completed")


def test_a_duplicate_arriving_during_the_slow_post_does_not_comment_twice(workspace, http_server):
    """The second delivery comes while GitHub is still answering the first one's POST."""
    import time

    from runs.notify import NotificationInFlight

    url = f"http://127.0.0.1:{http_server.server_port}"
    event_id = _completed(workspace, {"provider": "github", "repo": "octo/calc", "issue_number": 7})
    posting = threading.Event()
    original = Recorder.do_POST

    def slow_post(self) -> None:
        posting.set()
        time.sleep(1.5)  # the comment appears only when the answer comes
        original(self)

    outcomes: list[object] = []

    def deliver() -> None:
        try:
            with override_settings(GITHUB_API_URL=url):
                outcomes.append(event_consume(consumer="source_notification", event_id=event_id))
        except Exception as exc:
            outcomes.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    Recorder.do_POST = slow_post  # type: ignore[method-assign]
    try:
        first = threading.Thread(target=deliver)
        first.start()
        assert posting.wait(10)
        deliver()  # the duplicate, during the call
        first.join(20)
    finally:
        Recorder.do_POST = original  # type: ignore[method-assign]

    assert len(http_server.comments) == 1
    assert "processed" in outcomes
    # The duplicate was told to come back later (a retry), not allowed to post.
    assert any(isinstance(o, NotificationInFlight) for o in outcomes)
    # Its retry finds the comment sent and changes nothing.
    with override_settings(GITHUB_API_URL=url):
        assert event_consume(consumer="source_notification", event_id=event_id) == "duplicate"
    assert len(http_server.comments) == 1
