"""Rows named on a command line as the console shows them: a whole id, or a fragment of
one (the short id of a list, "b2fff730", optionally with its "#1")."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.core.management.base import CommandError
from django.db.models import Model

from jobs.ids import id_fragment_q

_RUN_NUMBER = re.compile(r"\s*#\d+$")


def row_by_id_fragment(model: type[Model], given: str, *, noun: str) -> Any:
    """The one row of ``model`` whose id is or contains ``given`` at either end; a
    CommandError names the candidates when there is none or more than one."""
    text = _RUN_NUMBER.sub("", given.strip())
    try:
        return model._default_manager.get(pk=uuid.UUID(text))
    except (ValueError, model.DoesNotExist):  # type: ignore[attr-defined]
        pass
    condition = id_fragment_q("pk", text)
    if condition is None:
        raise CommandError(f"{given!r} is not a {noun} id or a part of one (4+ hex digits)")
    found = list(model._default_manager.filter(condition).order_by("pk")[:6])
    if not found:
        raise CommandError(f"no {noun} has an id starting or ending with {text!r}")
    if len(found) > 1:
        names = ", ".join(str(row.pk) for row in found[:5])
        raise CommandError(f"{text!r} names {len(found)}+ {noun}s ({names}); give more digits")
    return found[0]
