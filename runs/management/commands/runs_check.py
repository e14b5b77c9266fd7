"""``manage.py runs_check [--run ID]``: every run's state rebuilt from its timeline and
compared with the stored row; prints each drift and exits 1 if there is any."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.progress import Progress

from runs.management.lookup import row_by_id_fragment
from runs.models import Run
from runs.replay.fold import SNAPSHOT_EVERY, run_check


class Command(BaseCommand):
    help = "Rebuild runs from their events and report drift from the stored state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", default=None)
        parser.add_argument("--snapshot-every", type=int, default=SNAPSHOT_EVERY)

    def handle(self, *args: Any, **options: Any) -> None:
        runs = Run.objects.order_by("created_at", "id")
        if options["run"]:
            runs = runs.filter(pk=row_by_id_fragment(Run, options["run"], noun="run").pk)
        drifted = 0
        with Progress(transient=True) as bar:
            task = bar.add_task("checking runs", total=runs.count())
            for run in runs.iterator(chunk_size=200):
                drift = run_check(run, snapshot_every=options["snapshot_every"])
                if drift.drifted:
                    drifted += 1
                    for name, (stored, folded) in drift.fields.items():
                        self.stdout.write(f"{run.id} {name}: stored {stored!r}, events {folded!r}")
                bar.advance(task)
        self.stdout.write(f"{drifted} run(s) drifted")
        if drifted:
            raise CommandError(f"{drifted} run(s) drifted from their events")
