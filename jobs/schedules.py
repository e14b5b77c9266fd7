"""The safety-net schedules beat runs, kept in django-celery-beat's tables.

Every one is a net under an event-driven path (DESIGN §1.2), so they run every 5-30 s,
not every second: beat costs CPU per tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction


@dataclass(frozen=True)
class Schedule:
    name: str
    task: str
    every_seconds: int


SCHEDULES = [
    Schedule("outbox sweep", "jobs.outbox_relay", 10),
    Schedule("zombie reaper", "jobs.zombies_reap", 10),
    Schedule("approval expiry", "jobs.approvals_expire", 30),
    Schedule("deferred task re-admission", "jobs.tasks_readmit", 15),
    Schedule("sandbox orphan sweep", "jobs.sandboxes_sweep", 300),
]


def beat_schedules_ensure(*, reset: bool = False) -> list[str]:
    """Create the schedules that are missing; returns their names.

    Idempotent. An operator's edits (interval, enabled) are kept unless ``reset``.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    created: list[str] = []
    with transaction.atomic():
        for schedule in SCHEDULES:
            interval, _ = IntervalSchedule.objects.get_or_create(
                every=schedule.every_seconds, period=IntervalSchedule.SECONDS
            )
            defaults = {
                "task": schedule.task,
                "interval": interval,
                "queue": "events",
                "enabled": True,
            }
            if reset:
                _, was_created = PeriodicTask.objects.update_or_create(
                    name=schedule.name, defaults=defaults
                )
            else:
                _, was_created = PeriodicTask.objects.get_or_create(
                    name=schedule.name, defaults=defaults
                )
            if was_created:
                created.append(schedule.name)
    return created
