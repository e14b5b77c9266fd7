"""``manage.py outbox_relay``: publish pending outbox events from the command line.

Workers relay on their own (woken on commit, swept by beat); this is for operators
draining a backlog, and for running a relay as a dedicated process with ``--loop``.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.relay import outbox_drain, outbox_lag_seconds


class Command(BaseCommand):
    help = "Publish pending outbox events (once, or in a loop with --loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="keep relaying until killed")
        parser.add_argument(
            "--interval", type=float, default=1.0, help="seconds between sweeps with --loop"
        )

    def handle(self, *args: Any, loop: bool = False, interval: float = 1.0, **options: Any) -> None:
        while True:
            report = outbox_drain()
            self.stdout.write(
                f"published {report.published}, failed partitions "
                f"{report.failed_partitions}, lag {outbox_lag_seconds():.1f}s"
            )
            self.stdout.flush()
            if not loop:
                return
            time.sleep(interval)
