"""``manage.py run_transcript RUN_ID``: a finished run as a transcript the scripted provider
replays (``model_options={"provider": "scripted", "script": <transcript>["script"]}``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.agent.transcript import transcript_export
from runs.models import Run
from runs.state import TERMINAL


class Command(BaseCommand):
    help = "Export a finished run as a replayable transcript (JSON on stdout)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = Run.objects.get(pk=options["run_id"])
        except (Run.DoesNotExist, ValueError, ValidationError) as exc:
            raise CommandError(f"no run {options['run_id']!r}") from exc
        if run.status not in TERMINAL:
            raise CommandError(f"run {run.id} is {run.status}; only a finished run exports")
        self.stdout.write(json.dumps(transcript_export(run), indent=1))
