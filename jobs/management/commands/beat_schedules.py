"""``manage.py beat_schedules``: create the safety-net schedules (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.schedules import beat_schedules_ensure


class Command(BaseCommand):
    help = "Create the beat schedules that are missing; --reset restores their defaults."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reset", action="store_true", help="overwrite operator edits with the defaults"
        )

    def handle(self, *args: Any, reset: bool = False, **options: Any) -> None:
        created = beat_schedules_ensure(reset=reset)
        self.stdout.write(f"created: {', '.join(created)}" if created else "all present")
