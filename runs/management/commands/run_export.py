"""``manage.py run_export RUN FILE``: a finished run's complete record as a tar.gz."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.management.lookup import row_by_id_fragment
from runs.models import Run
from runs.replay.archive import run_export
from runs.services import CommandRefused


class Command(BaseCommand):
    help = "Export a finished run (task, events, turns, tools, patches, artifacts) to a file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("file")

    def handle(self, *args: Any, **options: Any) -> None:
        run = row_by_id_fragment(Run, options["run"], noun="run")
        try:
            with open(options["file"], "wb") as out:
                manifest = run_export(run=run, out=out)
        except CommandRefused as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{options['file']}: {len(manifest['files'])} files")
