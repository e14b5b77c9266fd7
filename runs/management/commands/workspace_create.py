"""``manage.py workspace_create SLUG [--name NAME] [--admin USER]``: a new workspace.

With ``--admin`` the user (created without a usable password if missing) becomes the
workspace's admin. Prints the slug as the last line.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from runs.models import Membership, Workspace


class Command(BaseCommand):
    help = "Create a workspace (and optionally its first admin); prints the slug last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="short name used in URLs and commands, e.g. acme")
        parser.add_argument("--name", default="", help="display name (default: the slug)")
        parser.add_argument("--admin", help="username to make the workspace's admin")
        parser.add_argument("--max-active-runs", type=int, default=10)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["max_active_runs"] < 1:
            raise CommandError("--max-active-runs must be at least 1")
        workspace = Workspace(
            slug=options["slug"],
            name=options["name"] or options["slug"],
            max_active_runs=options["max_active_runs"],
        )
        try:
            workspace.full_clean()
        except ValidationError as exc:
            raise CommandError(
                "; ".join(
                    f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items()
                )
            ) from exc
        with transaction.atomic():
            workspace.save()
            if options["admin"]:
                user, created = get_user_model().objects.get_or_create(username=options["admin"])
                if created:
                    user.set_unusable_password()
                    user.save(update_fields=["password"])
                    self.stdout.write(f"created user {user.get_username()}")
                Membership.objects.create(
                    workspace=workspace, user=user, role=Membership.Role.ADMIN
                )
                self.stdout.write(f"{user.get_username()} is admin of {workspace.slug}")
        self.stdout.write(workspace.slug)
