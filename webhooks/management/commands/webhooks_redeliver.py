"""Redeliver failed GitHub webhook deliveries for a repository hook."""

from __future__ import annotations

from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webhooks.redelivery import github_deliveries_redeliver


class Command(BaseCommand):
    help = (
        "List recent deliveries of a GitHub repository hook and redeliver the failed "
        "ones (GitHub never retries by itself). Uses GITHUB_API_URL and GITHUB_TOKEN."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("repo", help="owner/name")
        parser.add_argument("hook_id")
        parser.add_argument(
            "--since-hours",
            type=float,
            default=72,
            help="look back this far (GitHub keeps deliveries 3 days)",
        )
        parser.add_argument("--dry-run", action="store_true", help="list what would be redelivered")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = github_deliveries_redeliver(
                repo=options["repo"],
                hook_id=options["hook_id"],
                since_hours=options["since_hours"],
                dry_run=options["dry_run"],
            )
        except httpx.HTTPError as exc:
            raise CommandError(f"GitHub API request failed: {exc}") from exc
        verb = "would redeliver" if options["dry_run"] else "redelivered"
        self.stdout.write(
            f"examined {report.examined}, {verb} {len(report.redelivered)}, "
            f"skipped {report.skipped}, errors {len(report.errors)}"
        )
        for error in report.errors:
            self.stderr.write(error)
        if report.errors:
            raise CommandError(f"{len(report.errors)} redeliveries failed")
