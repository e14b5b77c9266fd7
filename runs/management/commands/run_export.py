"""``manage.py run_export RUN_ID FILE``: a finished run's complete record as a tar.gz."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Run
from runs.replay.archive import run_export
from runs.services import CommandRefused


class Command(BaseCommand):
    help = "Export a finished run (task, events, turns, tools, patches, artifacts) to a file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("file")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = Run.objects.select_related("task__repository", "task__workspace").get(
                pk=options["run_id"]
            )
            with open(options["file"], "wb") as out:
                manifest = run_export(run=run, out=out)
        except (Run.DoesNotExist, ValueError, ValidationError) as exc:
            raise CommandError(f"no run {options['run_id']!r}") from exc
        except CommandRefused as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{options['file']}: {len(manifest['files'])} files")
