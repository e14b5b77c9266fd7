"""``manage.py run_retry RUN [--by NAME]``: a new run of the run's task."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import services
from runs.management.lookup import row_by_id_fragment
from runs.models import Run


class Command(BaseCommand):
    help = "Start a new run of a run's task (refused while one is active)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("--by", default="cli", help="who asks (recorded on the timeline)")

    def handle(self, *args: Any, **options: Any) -> None:
        run = row_by_id_fragment(Run, options["run"], noun="run")
        try:
            new = services.task_retry(task=run.task, by=options["by"])
        except services.CommandRefused as refused:
            raise CommandError(f"{run}: refused ({refused.code}): {refused.message}") from refused
        self.stdout.write(f"{run}: task retried as {new} ({new.status}).")
