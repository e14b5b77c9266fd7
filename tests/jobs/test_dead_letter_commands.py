"""Dead letters from the command line: requeue and discard through the console's
services, one line per letter, never a letter twice."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs.models import DeadLetter
from tests.factories import DeadLetterFactory

pytestmark = pytest.mark.django_db


def _call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_discard_by_id_fragment_closes_the_letter_and_a_second_time_changes_nothing():
    letter = DeadLetterFactory()

    printed = _call("deadletter_discard", letter.pk.hex[-8:], "--by", "oncall")

    letter.refresh_from_db()
    assert (letter.status, letter.resolved_by) == (DeadLetter.Status.DISCARDED, "oncall")
    assert "1 of 1 dead letter(s) discarded." in printed
    again = _call("deadletter_discard", str(letter.pk))
    assert "unchanged, already discarded" in again


def test_requeue_all_open_of_one_task_leaves_the_others():
    mine = [DeadLetterFactory(task_name="jobs.outbox_relay") for _ in range(2)]
    other = DeadLetterFactory(task_name="event.consume")

    printed = _call("deadletter_requeue", "--all-open", "--task", "jobs.outbox_relay")

    assert "2 of 2 dead letter(s) requeued." in printed
    for letter in mine:
        letter.refresh_from_db()
        assert letter.status == DeadLetter.Status.REQUEUED
    other.refresh_from_db()
    assert other.status == DeadLetter.Status.OPEN


def test_naming_letters_and_all_open_together_is_refused():
    letter = DeadLetterFactory()
    with pytest.raises(CommandError, match="not both"):
        _call("deadletter_requeue", str(letter.pk), "--all-open")
    with pytest.raises(CommandError, match="not both"):
        _call("deadletter_requeue")
