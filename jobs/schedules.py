"""The safety-net schedules beat runs, kept in django-celery-beat's tables.

Every one is a net under an event-driven path (docs/design.md §1.2), so they run every 5-30 s,
not every second: beat costs CPU per tick. ``jobs`` registers its own sweeps; the domain
apps register theirs from ``AppConfig.ready`` with ``schedule_register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction


@dataclass(frozen=True)
class Schedule:
    name: str
    task: str
    every_seconds: int


_registered: dict[str, Schedule] = {}


def schedule_register(schedule: Schedule) -> None:
    """Add a schedule that ``beat_schedules_ensure`` keeps in the database (by name)."""
    _registered[schedule.name] = schedule


def schedules_registered() -> list[Schedule]:
    return list(_registered.values())


schedule_register(Schedule("outbox sweep", "jobs.outbox_relay", 10))


def beat_schedules_ensure(*, reset: bool = False) -> list[str]:
    """Create the schedules that are missing; returns their names.

    Idempotent. An operator's edits (interval, enabled) are kept unless ``reset``; the
    task a schedule names is always the registered one, so a task that moved or was
    renamed is followed without operator action.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    created: list[str] = []
    with transaction.atomic():
        for schedule in schedules_registered():
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
                if not was_created:
                    PeriodicTask.objects.filter(name=schedule.name).exclude(
                        task=schedule.task
                    ).update(task=schedule.task)
            if was_created:
                created.append(schedule.name)
    return created


def beat_schedule_every(name: str, seconds: int) -> None:
    """Run the schedule ``name`` every ``seconds`` (as an operator's edit in the admin)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    if seconds < 1:
        raise ValueError(f"a schedule runs at most every second, not every {seconds}")
    with transaction.atomic():
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=seconds, period=IntervalSchedule.SECONDS
        )
        if not PeriodicTask.objects.filter(name=name).update(interval=interval):
            raise LookupError(f"no schedule named {name!r}")
        # Beat re-reads its schedules when this row changes.
        PeriodicTasks.update_changed()


def schedules_after_migrate(**kwargs: Any) -> None:
    """post_migrate: every install (fresh or upgraded) has the registered schedules."""
    beat_schedules_ensure()
