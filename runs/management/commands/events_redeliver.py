"""``manage.py events_redeliver CONSUMER [--run ID | --workspace SLUG] [--since T]
[--until T] [--outbox] [--apply]``: re-deliver recorded events to one consumer (or
``subscription:<id>``) through its idempotency guard. Without ``--apply`` it only
counts (the dry run)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime
from rich.progress import Progress

from jobs.consumers import PermanentConsumerError
from jobs.redelivery import outbox_envelopes, redeliver, redelivery_count
from runs.management.lookup import row_by_id_fragment
from runs.models import Run, Workspace
from runs.replay.redeliver import timeline_envelopes


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"not a time: {value!r} (ISO 8601)")
    return parsed


class Command(BaseCommand):
    help = "Re-deliver (or backfill) recorded events to one consumer; a dry run unless --apply."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("consumer", help="a consumer name or subscription:<id>")
        parser.add_argument("--run", default=None)
        parser.add_argument("--workspace", default=None, help="workspace slug")
        parser.add_argument("--since", default=None)
        parser.add_argument("--until", default=None)
        parser.add_argument(
            "--outbox", action="store_true", help="read the outbox instead of run timelines"
        )
        parser.add_argument("--apply", action="store_true")

    def _envelopes(self, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        workspace_id = None
        if options["workspace"]:
            workspace = Workspace.objects.filter(slug=options["workspace"]).first()
            if workspace is None:
                raise CommandError(f"no workspace {options['workspace']!r}")
            workspace_id = workspace.pk
        run_id = None
        if options["run"]:
            run_id = str(row_by_id_fragment(Run, options["run"], noun="run").pk)
        since, until = _time(options["since"]), _time(options["until"])
        if options["outbox"]:
            return outbox_envelopes(
                since=since, until=until, partition_key=run_id, workspace_id=workspace_id
            )
        return timeline_envelopes(
            run_id=run_id, workspace_id=workspace_id, since=since, until=until
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = redelivery_count(target=options["consumer"], envelopes=self._envelopes(options))
        except PermanentConsumerError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{count.target}: {count.events} events, {count.wanted} of its types, "
            f"{count.already_processed} already processed, {count.to_deliver} to deliver"
        )
        if not options["apply"]:
            return
        with Progress(transient=True) as bar:
            task = bar.add_task("re-delivering", total=count.events)
            report = redeliver(
                target=options["consumer"],
                envelopes=self._envelopes(options),
                progress=lambda n: bar.advance(task, n),
            )
        self.stdout.write(
            f"delivered {report.delivered}, duplicates {report.duplicates}, gone {report.gone}"
        )
        if report.failed:
            raise CommandError(f"stopped at {report.failed}")
