"""``manage.py run_import FILE --workspace SLUG``: an exported run, read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Workspace
from runs.replay.archive import ArchiveInvalid, run_import


class Command(BaseCommand):
    help = "Import a run archive for investigation (never dispatched, never acted on)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument("--workspace", required=True, help="workspace slug to import into")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = Workspace.objects.filter(slug=options["workspace"]).first()
        if workspace is None:
            raise CommandError(f"no workspace {options['workspace']!r}")
        try:
            run = run_import(path=Path(options["file"]), workspace=workspace, by="manage.py")
        except ArchiveInvalid as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"imported as run {run.id} (task {run.task_id})")
