"""Run events get gap-free, unique sequence numbers even from concurrent processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobs.models import OutboxEvent
from runs.models import Run
from tests.factories import TaskFactory

ROOT = Path(__file__).resolve().parents[2]

APPEND = """
import django, sys
django.setup()
from django.db import transaction
from runs.models import Run
from runs.timeline import PendingEvent, events_record
run = Run.objects.select_related("task").get(pk=sys.argv[1])
for i in range(int(sys.argv[2])):
    with transaction.atomic():
        events_record(task=run.task, run=run, events=[
            PendingEvent("agent.test.appended", {"writer": sys.argv[3], "i": i}),
            PendingEvent("agent.test.appended", {"writer": sys.argv[3], "i": i, "second": True}),
        ])
"""


@pytest.mark.django_db(transaction=True)
def test_two_processes_appending_at_once_leave_no_gaps_and_no_duplicates():
    run = Run.objects.create(task=TaskFactory(), run_no=1)
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", APPEND, str(run.id), "60", name],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
        )
        for name in ("a", "b")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err.decode()

    sequence = list(run.events.order_by("sequence_no").values_list("sequence_no", flat=True))
    assert sequence == list(range(1, 241))
    # Each transaction's two events are adjacent: appends do not interleave.
    events = list(run.events.order_by("sequence_no").values_list("data", flat=True))
    for first, second in zip(events[::2], events[1::2], strict=True):
        assert first["writer"] == second["writer"] and first["i"] == second["i"]
    run.refresh_from_db()
    assert run.last_sequence_no == 240
    assert OutboxEvent.objects.filter(partition_key=str(run.id)).count() == 240


@pytest.mark.django_db
def test_a_rolled_back_append_returns_its_numbers():
    from django.db import transaction

    from runs.timeline import event_record

    run = Run.objects.create(task=TaskFactory(), run_no=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        event_record(task=run.task, run=run, type="agent.test.appended")
        raise RuntimeError("abort")
    with transaction.atomic():
        event = event_record(task=run.task, run=run, type="agent.test.appended")
    assert event is not None and event.sequence_no == 1
