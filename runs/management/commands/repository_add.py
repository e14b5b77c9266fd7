"""``manage.py repository_add --workspace SLUG --name NAME --clone-url URL``: register a
repository (as an operator: a local path must be under ``LOCAL_REPOSITORY_ROOTS``).

Prints the repository id, the ``repository`` of ``POST /api/tasks/``, as the last line.
Without ``--test-command`` each run detects how the repository's tests run and the setup
that installs their dependencies in the sandbox (``runs.agent.environment``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Repository, Workspace
from runs.repositories import CloneUrlRefused, clone_url_check


def _provider_guess(clone_url: str) -> str | None:
    if clone_url.startswith(("/", "file://")):
        return Repository.Provider.LOCAL
    if "github.com" in clone_url:
        return Repository.Provider.GITHUB
    if "gitlab" in clone_url:
        return Repository.Provider.GITLAB
    return None


class Command(BaseCommand):
    help = "Register a repository in a workspace; prints its id last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workspace", required=True, help="workspace slug")
        parser.add_argument("--name", required=True, help="name, unique in the workspace")
        parser.add_argument("--clone-url", required=True, help="https/ssh URL or local path")
        parser.add_argument(
            "--provider", choices=[p.value for p in Repository.Provider], default=None
        )
        parser.add_argument("--external-id", default="", help="e.g. octo-org/hello on GitHub")
        parser.add_argument("--default-branch", default="main")
        parser.add_argument(
            "--test-command",
            default=None,
            help="default: detected at each run from the repository's files (pytest, "
            "unittest, npm test, go test, cargo test), with a setup installing the test "
            "dependencies in the sandbox unless --setup-command is given",
        )
        parser.add_argument(
            "--setup-command",
            default=None,
            help="run in the sandbox before the agent, its result cached (default: none "
            "with --test-command, else the detected one)",
        )
        parser.add_argument(
            "--no-setup-network",
            action="store_true",
            help="no network for the setup either (the default setup downloads packages)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = Workspace.objects.filter(slug=options["workspace"]).first()
        if workspace is None:
            raise CommandError(
                f"no workspace {options['workspace']!r}; "
                f"create it with: manage.py workspace_create {options['workspace']}"
            )
        clone_url = options["clone_url"].strip()
        try:
            clone_url_check(clone_url, staff=True)
        except CloneUrlRefused as exc:
            raise CommandError(f"--clone-url refused: {exc}") from exc
        provider = options["provider"] or (
            Repository.Provider.LOCAL
            if "://" not in clone_url and ":" not in clone_url
            else Repository.Provider.GITHUB
        )
        repository = Repository(
            workspace=workspace,
            name=options["name"],
            provider=provider,
            external_id=options["external_id"],
            clone_url=clone_url,
            default_branch=options["default_branch"],
        )
        if options["test_command"]:
            repository.test_command = options["test_command"]
        if options["setup_command"]:
            repository.setup_command = options["setup_command"]
        repository.setup_network = not options["no_setup_network"]
        try:
            repository.full_clean()
        except ValidationError as exc:
            raise CommandError(
                "; ".join(
                    f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items()
                )
            ) from exc
        repository.save()
        if not repository.test_command:
            self.stdout.write("its test command and setup are detected at each run")
        self.stdout.write(f"repository {repository.name} added to {workspace.slug}; its id:")
        self.stdout.write(str(repository.pk))
