"""Missed GitHub deliveries: GitHub never retries, so failed ones are redelivered by us."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from runs.gitproviders.credentials import OriginScopedAuth
from webhooks.logs import log
from webhooks.models import WebhookReceipt


@dataclass
class RedeliveryReport:
    examined: int = 0
    redelivered: list[int] = field(default_factory=list)
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


def _client() -> httpx.Client:
    headers = {
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
        "User-Agent": "agentplatform",
    }
    # The token goes to the API's own origin only: a pagination link naming another host
    # gets the request without it.
    auth = (
        OriginScopedAuth(
            api_url=settings.GITHUB_API_URL,
            header="Authorization",
            value=f"Bearer {settings.GITHUB_TOKEN}",
        )
        if settings.GITHUB_TOKEN
        else None
    )
    return httpx.Client(
        base_url=settings.GITHUB_API_URL.rstrip("/"), headers=headers, auth=auth, timeout=30
    )


def _deliveries(client: httpx.Client, path: str, since: datetime) -> list[dict[str, Any]]:
    """Deliveries newer than ``since``, newest first, following the cursor pagination."""
    found: list[dict[str, Any]] = []
    url: str | None = path
    params: dict[str, Any] | None = {"per_page": 100}
    while url:
        response = client.get(url, params=params)
        response.raise_for_status()
        page = response.json()
        for delivery in page:
            delivered = datetime.fromisoformat(str(delivery["delivered_at"]).replace("Z", "+00:00"))
            if delivered < since:
                return found
            found.append(delivery)
        url = response.links.get("next", {}).get("url")
        params = None  # the next link carries the cursor and page size
    return found


def github_deliveries_redeliver(
    *, repo: str, hook_id: str, since_hours: float = 72, dry_run: bool = False
) -> RedeliveryReport:
    """Redeliver the failed deliveries of one repository hook from the last ``since_hours``.

    A GUID counts as delivered if any attempt for it succeeded or if we hold a receipt
    for it (our answer may have been lost after we committed); each remaining GUID is
    redelivered once, from its most recent attempt.
    """
    path = f"/repos/{repo}/hooks/{hook_id}/deliveries"
    since = timezone.now() - timedelta(hours=since_hours)
    report = RedeliveryReport()
    with _client() as client:
        deliveries = _deliveries(client, path, since)
        report.examined = len(deliveries)
        succeeded = {d["guid"] for d in deliveries if 200 <= int(d.get("status_code") or 0) < 300}
        received = set(
            WebhookReceipt.objects.filter(
                provider="github",
                hook_id=str(hook_id),
                delivery_id__in={d["guid"] for d in deliveries},
            ).values_list("delivery_id", flat=True)
        )
        seen: set[str] = set()
        for delivery in deliveries:  # newest first: the latest attempt per GUID
            guid = delivery["guid"]
            if guid in seen:
                continue
            seen.add(guid)
            if guid in succeeded or guid in received:
                report.skipped += 1
                continue
            if dry_run:
                report.redelivered.append(int(delivery["id"]))
                continue
            response = client.post(f"{path}/{delivery['id']}/attempts")
            if response.status_code in (200, 201, 202):
                report.redelivered.append(int(delivery["id"]))
                log.info("webhook.redelivered", repo=repo, hook_id=hook_id, guid=guid)
            else:
                report.errors.append(f"{delivery['id']}: HTTP {response.status_code}")
                log.warning(
                    "webhook.redelivery_failed",
                    repo=repo,
                    hook_id=hook_id,
                    guid=guid,
                    status=response.status_code,
                )
    return report
