"""The leader's scheduler sends each due entry once, even when the schedule is re-read
right after a send (another beat starting, an operator's edit)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agentplatform.celery import app
from jobs.beat import LeaderDatabaseScheduler

pytestmark = pytest.mark.django_db(transaction=True)


class Recording(LeaderDatabaseScheduler):
    """Records what it would send instead of sending it."""

    def __init__(self, *args, **kwargs):
        self.sent: list[str] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        self.sent.append(entry.name)


def test_an_entry_is_not_sent_again_when_the_schedule_changes_after_a_send():
    PeriodicTask.objects.all().delete()
    every, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    for name in ("first", "second"):
        PeriodicTask.objects.create(
            name=name,
            task="runs.tasks_readmit",
            interval=every,
            queue="test_h1.none",
            last_run_at=timezone.now() - timedelta(hours=1),
        )
    scheduler = Recording(app=app)
    scheduler.producer = object()  # apply_async above never uses it
    try:
        scheduler.tick()  # leadership, then the first due entry
        scheduler.tick()  # the second
        assert sorted(scheduler.sent) == ["first", "second"]
        # The heap is rebuilt from the in-memory schedule before the next sync, as
        # django-celery-beat does when it saw the tables change twice within one tick
        # (a second beat starting up writes its default entries).
        scheduler._heap_invalidated = True
        for _ in range(4):
            scheduler.tick()
    finally:
        scheduler.close()

    assert sorted(scheduler.sent) == ["first", "second"]
