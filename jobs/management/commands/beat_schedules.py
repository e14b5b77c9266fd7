"""``manage.py beat_schedules``: create the safety-net schedules (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.schedules import beat_schedule_every, beat_schedules_ensure


class Command(BaseCommand):
    help = "Create the beat schedules that are missing; --reset restores their defaults."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reset", action="store_true", help="overwrite operator edits with the defaults"
        )
        parser.add_argument(
            "--every",
            action="append",
            default=[],
            metavar="NAME=SECONDS",
            help='then run a schedule at another interval, e.g. --every "zombie reaper=2"',
        )

    def handle(
        self, *args: Any, reset: bool = False, every: list[str] | None = None, **options: Any
    ) -> None:
        created = beat_schedules_ensure(reset=reset)
        self.stdout.write(f"created: {', '.join(created)}" if created else "all present")
        for change in every or []:
            name, _, seconds = change.rpartition("=")
            try:
                beat_schedule_every(name.strip(), int(seconds))
            except (ValueError, LookupError) as exc:
                raise CommandError(f"--every {change!r}: {exc}") from exc
            self.stdout.write(f"{name.strip()}: every {int(seconds)} s")
