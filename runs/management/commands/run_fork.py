"""``manage.py run_fork RUN --turn N [--profile NAME]``: a new run that reuses the
run's first N model turns and asks the model from there."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.management.lookup import row_by_id_fragment
from runs.models import Run
from runs.replay.fork import run_fork
from runs.services import CommandRefused


class Command(BaseCommand):
    help = "Fork a finished run after model turn N (same or another model profile)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("--by", default="cli", help="who asks (recorded on the timelines)")
        parser.add_argument("--turn", type=int, required=True)
        parser.add_argument("--profile", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        run = row_by_id_fragment(Run, options["run"], noun="run")
        try:
            fork = run_fork(
                run=run, turn=options["turn"], profile=options["profile"], by=options["by"]
            )
        except CommandRefused as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"fork run {fork.id} of task {fork.task_id} queued")
