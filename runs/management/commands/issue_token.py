"""``manage.py issue_token --user NAME [--workspace SLUG]``: a new API token.

Creates the user (without a usable password) and the workspace membership if they are
missing. The token is printed once, as the last line; only its hash is stored.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from agentplatform.api.auth import api_token_issue
from runs.models import Membership, Workspace


class Command(BaseCommand):
    help = "Issue an API token for a user (created if missing); prints it as the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--workspace", help="workspace slug to make the user a member of")
        parser.add_argument(
            "--role",
            choices=[r.value for r in Membership.Role],
            default=Membership.Role.MEMBER,
            help="role when a membership is created (default: member)",
        )
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            user_model = get_user_model()
            user, created = user_model.objects.get_or_create(username=options["user"])
            if created:
                user.set_unusable_password()
                user.save(update_fields=["password"])
                self.stdout.write(f"created user {user.get_username()}")
            if options["workspace"]:
                workspace = Workspace.objects.filter(slug=options["workspace"]).first()
                if workspace is None:
                    raise CommandError(
                        f"no workspace {options['workspace']!r}; create it with: "
                        f"manage.py workspace_create {options['workspace']}"
                    )
                _, joined = Membership.objects.get_or_create(
                    workspace=workspace, user=user, defaults={"role": options["role"]}
                )
                if joined:
                    self.stdout.write(
                        f"added {user.get_username()} to {workspace.slug} as {options['role']}"
                    )
            token, secret = api_token_issue(user=user, name=options["name"] or "cli")
        self.stdout.write(f"token {token.prefix}… issued; it is shown only once:")
        self.stdout.write(secret)
