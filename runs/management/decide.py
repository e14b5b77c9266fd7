"""Approve or reject from the command line, through the one approval service."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from runs import services
from runs.management.lookup import row_by_id_fragment
from runs.models import Run


def approval_decide_from_cli(
    *, approve: bool, run: str, user: str, patch: str | None, comment: str, **_: Any
) -> str:
    """Decide the run's pending approval as ``user``; the line to print, or CommandError."""
    found = row_by_id_fragment(Run, run, noun="run")
    person = get_user_model()._default_manager.filter(username=user).first()
    if person is None:
        raise CommandError(f"no user named {user!r}")
    decide = services.run_approve if approve else services.run_reject
    try:
        approval = decide(
            run=found,
            by=person.get_username(),
            comment=comment,
            user=person,
            patch_sha256=patch or None,
        )
    except services.CommandRefused as refused:
        raise CommandError(f"{found}: refused ({refused.code}): {refused.message}") from refused
    verb = "approved" if approve else "rejected"
    return f"{found}: patch {approval.patch_sha256[:12]} {verb} by {person.get_username()}."
