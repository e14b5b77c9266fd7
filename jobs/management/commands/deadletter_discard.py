"""``manage.py deadletter_discard LETTER... | --all-open [--task NAME]``: close without running."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.management.letters import letters_act


class Command(BaseCommand):
    help = "Discard dead letters (by id or id fragment, or every open one) and say which."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("letters", nargs="*", help="dead letter ids or fragments")
        parser.add_argument("--all-open", action="store_true", help="every open dead letter")
        parser.add_argument("--task", default="", help="with --all-open: only this task name")
        parser.add_argument("--by", default="cli", help="who acts (recorded on the letter)")

    def handle(self, *args: Any, **options: Any) -> None:
        letters_act("discard", out=self.stdout, **options)
