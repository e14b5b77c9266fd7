"""``manage.py run_replay RUN [--by NAME]``: reproduce a finished run without its model, with a
progress bar, and print where the reproduction diverged (exit 1 if it did)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.progress import Progress

from runs.management.lookup import row_by_id_fragment
from runs.models import Run
from runs.replay.reproduce import replay_execute, replay_request
from runs.services import CommandRefused


class Command(BaseCommand):
    help = "Reproduce a finished run from its record (no model calls) and report divergences."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("--by", default="cli", help="who asks (recorded on the timeline)")

    def handle(self, *args: Any, **options: Any) -> None:
        run = row_by_id_fragment(Run, options["run"], noun="run")
        try:
            replay = replay_request(run=run, by=options["by"])
        except CommandRefused as exc:
            raise CommandError(exc.message) from exc
        with Progress(transient=True) as bar:
            task = bar.add_task("replaying", total=replay.total)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what[:40])

            replay = replay_execute(replay_id=str(replay.id), progress=progress)
        self.stdout.write(f"replay {replay.id}: {replay.status}")
        for divergence in replay.divergences:
            self.stdout.write(json.dumps(divergence))
        if replay.status != "reproduced":
            raise CommandError(f"{len(replay.divergences)} divergence(s)")
