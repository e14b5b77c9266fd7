"""``manage.py active_runs_recount [--fix]``: compare admission's counts of active runs
with the runs, and rebuild them with ``--fix``.

Prints one line per workspace or repository whose stored count differs; exits 1 when
any differs and ``--fix`` was not given.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.active_runs import recount


class Command(BaseCommand):
    help = "Compare admission's counts of active runs with the runs; --fix rebuilds them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--fix", action="store_true", help="rebuild the counts from the runs")

    def handle(self, *args: Any, **options: Any) -> None:
        drift = recount(fix=options["fix"])
        for d in drift:
            what = f"workspace {d.workspace_id}" + (
                f" repository {d.repository_id}" if d.repository_id else ""
            )
            self.stdout.write(f"{what}: stored {d.stored}, active runs {d.counted}")
        if not drift:
            self.stdout.write("the counts of active runs agree with the runs")
        elif options["fix"]:
            self.stdout.write(f"rebuilt: {len(drift)} counts were wrong")
        else:
            raise CommandError(f"{len(drift)} counts differ; run with --fix to rebuild them")
