"""Requeue or discard dead letters from the command line, through the console's services."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from jobs.ids import id_fragment_q
from jobs.models import DeadLetter
from jobs.services import dead_letter_discard, dead_letter_requeue


def _letter(given: str) -> DeadLetter:
    try:
        return DeadLetter.objects.get(pk=uuid.UUID(given))
    except (ValueError, DeadLetter.DoesNotExist):
        pass
    condition = id_fragment_q("pk", given)
    if condition is None:
        raise CommandError(f"{given!r} is not a dead letter id or a part of one")
    found = list(DeadLetter.objects.filter(condition).order_by("pk")[:6])
    if len(found) != 1:
        raise CommandError(f"{given!r} names {len(found)} dead letters; give the id or more digits")
    return found[0]


def letters_act(
    action: str,
    *,
    out: OutputWrapper,
    letters: list[str],
    all_open: bool,
    task: str,
    by: str,
    **_: Any,
) -> None:
    """Apply ``action`` (requeue or discard) to each letter and print one line each."""
    if bool(letters) == all_open:
        raise CommandError("name dead letters or give --all-open (not both)")
    if all_open:
        chosen = DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).order_by("created_at")
        if task:
            chosen = chosen.filter(task_name=task)
        targets = list(chosen[:10_000])
    else:
        targets = [_letter(given) for given in letters]
    operate = dead_letter_requeue if action == "requeue" else dead_letter_discard
    done = f"{action}d" if action.endswith("e") else f"{action}ed"
    changed = 0
    for letter in targets:
        if operate(letter=letter, by=by):
            changed += 1
            out.write(f"{letter.pk} {letter.task_name}: {done}")
        else:
            out.write(f"{letter.pk} {letter.task_name}: unchanged, already {letter.status}")
    out.write(f"{changed} of {len(targets)} dead letter(s) {done}.")
