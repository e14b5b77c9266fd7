"""Beat sleeps until its next entry is due, and reads edited schedules within seconds.

Celery takes a 10 ms drift allowance off the time left to an entry that is not due yet,
so an entry due in under 10 ms made ``tick`` return a negative interval, on which beat
ticks again without sleeping. Every time entries fell due it spun a dozen ticks, each
with django-celery-beat's database round trips: half of an idle beat's CPU.
"""

from __future__ import annotations

import time

import pytest
from django_celery_beat.models import PeriodicTask

from agentplatform.celery import app
from jobs import beat
from tests.beat_recording import Recording, entries_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_beat_sleeps_until_an_entry_is_due_instead_of_ticking_without_pause():
    entries_due("first", "second", every=1)
    scheduler = Recording(app=app)
    scheduler.producer = object()  # Recording.apply_async never uses it
    intervals: list[float] = []
    try:
        deadline = time.monotonic() + 3.2
        while time.monotonic() < deadline:  # celery.beat.Service.start's loop
            interval = scheduler.tick()
            intervals.append(interval)
            if interval and interval > 0:
                time.sleep(interval)
    finally:
        scheduler.close()

    assert len(scheduler.sent) >= 6, scheduler.sent  # each entry at 0, 1, 2 and 3 s
    assert min(intervals) >= 0, [i for i in intervals if i < 0]
    # A send, a tick for the next entry, and one short wait for a due time a few
    # milliseconds away: not the dozens of ticks of a spin.
    assert len(intervals) <= 4 * len(scheduler.sent) + 4, len(intervals)


def test_an_edited_schedule_is_read_within_the_check_interval(monkeypatch):
    entries_due("first", every=30)
    clock = [1000.0]
    monkeypatch.setattr(beat, "monotonic", lambda: clock[0])
    scheduler = Recording(app=app)
    scheduler.producer = object()
    try:
        scheduler.tick()  # leadership and the first read
        scheduler.tick()
        assert "first" in scheduler.schedule

        task = PeriodicTask.objects.get(name="first")
        task.enabled = False
        task.save()  # as the admin saves it: marks the schedules changed
        clock[0] += 1
        assert "first" in scheduler.schedule  # not asked again yet
        clock[0] += beat.SCHEDULE_CHECK_SECONDS
        assert "first" not in scheduler.schedule
    finally:
        scheduler.close()
