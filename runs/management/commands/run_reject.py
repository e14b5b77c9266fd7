"""``manage.py run_reject RUN --as USER [--patch SHA256] [--comment TEXT]``.

The workspace's approval policy applies to USER exactly as in the API and the console.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.management.decide import approval_decide_from_cli


class Command(BaseCommand):
    help = "Reject a run's pending patch as a platform user (the approval policy applies)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", help="run id, or the short id the console shows")
        parser.add_argument("--as", dest="user", required=True, help="the rejecting user")
        parser.add_argument("--patch", default=None, help="sha256 of the patch rejected")
        parser.add_argument("--comment", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(approval_decide_from_cli(approve=False, **options))
