"""Beat sleeps until its next entry is due, and reads edited schedules within seconds.

Celery takes a 10 ms drift allowance off the time left to an entry that is not due yet,
so an entry due in under 10 ms made ``tick`` return a negative interval, on which beat
ticks again without sleeping. Every time entries fell due it spun a dozen ticks, each
with django-celery-beat's database round trips: half of an idle beat's CPU.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agentplatform.celery import app
from jobs import beat
from jobs.beat import LeaderDatabaseScheduler

pytestmark = pytest.mark.django_db(transaction=True)


class Recording(LeaderDatabaseScheduler):
    """Records what it would send instead of sending it."""

    def __init__(self, *args, **kwargs):
        self.sent: list[str] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        self.sent.append(entry.name)


def _entries(*names: str, every: int) -> None:
    PeriodicTask.objects.all().delete()
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
    for name in names:
        PeriodicTask.objects.create(
            name=name,
            task="runs.tasks_readmit",
            interval=interval,
            queue="test_h1.none",
            last_run_at=timezone.now() - timedelta(hours=1),
        )


def test_beat_sleeps_until_an_entry_is_due_instead_of_ticking_without_pause():
    _entries("first", "second", every=1)
    scheduler = Recording(app=app)
    scheduler.producer = object()  # apply_async above never uses it
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
    _entries("first", every=30)
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
