"""``manage.py run_fork RUN_ID --turn N [--profile NAME]``: a new run that reuses the
run's first N model turns and asks the model from there."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Run
from runs.replay.fork import run_fork
from runs.services import CommandRefused


class Command(BaseCommand):
    help = "Fork a finished run after model turn N (same or another model profile)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--turn", type=int, required=True)
        parser.add_argument("--profile", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = Run.objects.select_related("task").get(pk=options["run_id"])
            fork = run_fork(
                run=run, turn=options["turn"], profile=options["profile"], by="manage.py run_fork"
            )
        except (Run.DoesNotExist, ValueError, ValidationError) as exc:
            raise CommandError(f"no run {options['run_id']!r}") from exc
        except CommandRefused as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"fork run {fork.id} of task {fork.task_id} queued")
