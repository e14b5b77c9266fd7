"""A leader scheduler that records what it would send, and schedule entries all due."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from jobs.beat import LeaderDatabaseScheduler


class Recording(LeaderDatabaseScheduler):
    """Records what it would send instead of sending it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[str] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any):
        self.sent.append(entry.name)


def entries_due(*names: str, every: int) -> None:
    """Only these schedule entries, every ``every`` seconds, each last run an hour ago."""
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
