"""``manage.py run_cancel RUN [--reason TEXT] [--by NAME]``: ask a run to stop."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs import services
from runs.management.lookup import row_by_id_fragment
from runs.models import Run


class Command(BaseCommand):
    help = "Request cancellation of a run (by id or the short id the console shows)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("--reason", default="cancelled from the command line")
        parser.add_argument("--by", default="cli", help="who asks (recorded on the timeline)")

    def handle(self, *args: Any, **options: Any) -> None:
        run = row_by_id_fragment(Run, options["run"], noun="run")
        if services.run_cancel_request(run=run, by=options["by"], reason=options["reason"]):
            self.stdout.write(f"{run}: cancellation requested (was {run.status}); it stops at")
            self.stdout.write("its next check and ends cancelled.")
        else:
            self.stdout.write(f"{run}: unchanged, it already ended {run.status}.")
