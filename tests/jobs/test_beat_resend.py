"""The leader's scheduler sends each due entry once, even when the schedule is re-read
right after a send (another beat starting, an operator's edit)."""

from __future__ import annotations

import pytest

from agentplatform.celery import app
from tests.beat_recording import Recording, entries_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_entry_is_not_sent_again_when_the_schedule_changes_after_a_send():
    entries_due("first", "second", every=30)
    scheduler = Recording(app=app)
    scheduler.producer = object()  # Recording.apply_async never uses it
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
