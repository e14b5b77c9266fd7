"""A worker killed while it posts a completion comment: the comment is still there once,
and the notification ends sent, not as a dead letter.

The killed sender leaves its lease on the notification row. The next attempts must wait
for that lease (another sender's call may still be in flight) without spending their
retries on the wait: GitHub stored the comment, so the attempt after the lease finds
its marker and records it.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest
from django.db import transaction

from jobs.models import DeadLetter, Notification, OutboxEvent, WorkItem
from jobs.relay import outbox_drain
from runs.models import Run
from runs.notify import MARKER
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory
from tests.jobs.test_consumer_outgoing_http import Recorder
from tests.jobs.test_work_items import _sweep_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class GitHub(Recorder):
    """Issue comments; the first POST is stored, then its sender is killed unanswered."""

    def do_GET(self) -> None:
        self.server.gets += 1
        super().do_GET()

    def do_POST(self) -> None:
        if self.server.victim is None:
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.comments.append(
            {
                "id": len(self.server.comments) + 1,
                "body": body["body"],
                "html_url": f"https://github.test/c{len(self.server.comments) + 1}",
            }
        )
        victim, self.server.victim = self.server.victim, None
        victim.kill()  # the connection dies with its sender, unanswered


@pytest.fixture
def github():
    server = ThreadingHTTPServer(("127.0.0.1", 0), GitHub)
    server.comments, server.requests, server.failures = [], [], 0
    server.gets, server.victim = 0, None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_sender_killed_mid_post_leaves_one_comment_and_no_dead_letter(
    workspace, github, start_worker
):
    env = {
        "GITHUB_API_URL": f"http://127.0.0.1:{github.server_port}",
        "GITHUB_TIMEOUT_SECONDS": "1",
        # The killed claim ends soon; retries come fast, so all five would be spent
        # within the killed sender's lease if waiting for it cost attempts.
        "WORK_LEASE_SECONDS": "2",
        "EVENT_CONSUMER_RETRY_BASE_SECONDS": "0.1",
        "EVENT_CONSUMER_MAX_RETRIES": "5",
    }
    github.victim = start_worker("sender", queues="events", concurrency=1, env=env)
    task = TaskFactory(
        workspace=workspace,
        source_ref={"provider": "github", "repo": "octo/calc", "issue_number": 7},
    )
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        events_record(task=task, run=run, events=[PendingEvent("agent.task.completed", {})])
    event_id = str(OutboxEvent.objects.get(type="agent.task.completed").event_id)
    outbox_drain()

    _sweep_until(lambda: github.victim is None, timeout=30, message="the sender is killed")
    note = Notification.objects.get(event_id=event_id)
    assert (note.status, note.attempts) == (Notification.Status.PENDING, 1)
    assert note.lease_until is not None

    start_worker("next", queues="events", concurrency=1, env=env)
    _sweep_until(
        lambda: (
            Notification.objects.filter(event_id=event_id, status=Notification.Status.SENT).exists()
            or DeadLetter.objects.exists()
        ),
        timeout=60,
        message="the notification is sent or dead",
    )

    assert DeadLetter.objects.count() == 0
    assert len(github.comments) == 1
    assert MARKER.format(event_id=event_id) in github.comments[0]["body"]
    note.refresh_from_db()
    assert (note.status, note.external_id) == (Notification.Status.SENT, "1")
    # The next attempt searched for the marker instead of posting again.
    assert github.gets >= 1
    item = WorkItem.objects.get(kind="event.consume", key__startswith="source_notification:")
    assert item.status == WorkItem.Status.DONE
    # The waits gave their attempts back: the claim the sender died holding, and the one
    # that found the marker.
    assert item.attempts <= 3, item.attempts
