"""``beat_schedules --every NAME=SECONDS``: an operator's interval edit from the command line."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import PeriodicTask, PeriodicTasks

pytestmark = pytest.mark.django_db


def test_every_sets_the_interval_and_tells_beat() -> None:
    call_command("beat_schedules")
    before = PeriodicTasks.last_change()
    call_command("beat_schedules", "--every", "zombie reaper=2", "--every", "work sweep=3")
    assert PeriodicTask.objects.get(name="zombie reaper").interval.every == 2
    assert PeriodicTask.objects.get(name="work sweep").interval.every == 3
    assert PeriodicTasks.last_change() != before
    # The edit survives a later ensure, as any operator edit does.
    call_command("beat_schedules")
    assert PeriodicTask.objects.get(name="zombie reaper").interval.every == 2


@pytest.mark.parametrize("change", ["no such schedule=2", "zombie reaper=0", "zombie reaper=x"])
def test_a_bad_change_is_refused_and_changes_nothing(change: str) -> None:
    call_command("beat_schedules")
    every = PeriodicTask.objects.get(name="zombie reaper").interval.every
    with pytest.raises(CommandError):
        call_command("beat_schedules", "--every", change)
    assert PeriodicTask.objects.get(name="zombie reaper").interval.every == every
