"""Tell the source of a task how it ended: a comment on the GitHub issue or PR.

Idempotency key: event id + channel (a Notification row). GitHub has no idempotency
key for comments, so every comment carries a hidden marker with the event id; when an
earlier attempt may have posted (the row exists but is not marked sent), the sender
looks for the marker before posting again. A crash can therefore not double-comment,
except in the instant between GitHub storing the comment and listing it.

The row's lease says a sender is calling GitHub. It covers one call and is renewed
before the next, so a sender that died mid-call holds back the next attempt for at most
one call's time; that attempt is deferred (``WorkDeferred``) until the lease ends,
without spending one of its retries.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.consumers import Completion, Consumer, Event, PermanentConsumerError
from jobs.logs import log
from jobs.models import Notification
from jobs.work import WorkDeferred
from runs.gitproviders.credentials import OriginScopedAuth
from runs.models import PullRequest, Task

CHANNEL_GITHUB_COMMENT = "github_comment"
MARKER = "<!-- agentplatform:notification:{event_id} -->"
# Pages of comments searched for the marker before posting again (100 per page).
MARKER_SEARCH_PAGES = 10


class GitHubUnavailable(Exception):
    """A retryable GitHub failure (5xx, rate limit, network)."""


class NotificationInFlight(WorkDeferred):
    """Another attempt holds the notification's lease (its call may still succeed): come
    back when the lease ends."""


def _timeout() -> float:
    return float(getattr(settings, "GITHUB_TIMEOUT_SECONDS", 30.0))


def _lease_seconds() -> float:
    """How long one call may take: connecting, sending and reading, each up to the
    timeout."""
    return 3 * _timeout()


def github_target(source_ref: dict[str, Any]) -> tuple[str, int] | None:
    """(owner/name, issue or PR number) if the task came from GitHub, else None."""
    if (source_ref or {}).get("provider") != "github":
        return None
    repo = source_ref.get("repo") or source_ref.get("repository")
    number = (
        source_ref.get("issue_number")
        or source_ref.get("pull_number")
        or source_ref.get("pr_number")
        or source_ref.get("number")
    )
    if not repo or not number:
        return None
    try:
        return str(repo), int(number)
    except (TypeError, ValueError):
        return None


def comment_body(*, event: Event, pr_url: str) -> str:
    marker = MARKER.format(event_id=event.id)
    if event.type == "agent.task.completed":
        text = "agentplatform finished this task."
        if pr_url:
            text += f" Pull request: {pr_url}"
    elif event.type == "agent.task.cancelled":
        text = "agentplatform cancelled this task."
    else:
        reason = str(event.data.get("reason") or "failed")
        text = f"agentplatform could not finish this task ({reason})."
        detail = str(event.data.get("detail") or "")[:500]
        if detail:
            text += f"\n\n> {detail}"
    return f"{text}\n\n{marker}"


def _client() -> httpx.Client:
    headers = {
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
        "User-Agent": "agentplatform",
    }
    auth = None
    if settings.GITHUB_TOKEN:
        # Only to the API's own origin (runs.gitproviders.credentials).
        auth = OriginScopedAuth(
            api_url=settings.GITHUB_API_URL,
            header="Authorization",
            value=f"Bearer {settings.GITHUB_TOKEN}",
        )
    return httpx.Client(
        base_url=settings.GITHUB_API_URL.rstrip("/"),
        headers=headers,
        auth=auth,
        timeout=_timeout(),
    )


def _check(response: httpx.Response) -> None:
    if response.is_success:
        return
    status = response.status_code
    limited = status == 403 and response.headers.get("x-ratelimit-remaining") == "0"
    if status >= 500 or status == 429 or limited:
        raise GitHubUnavailable(f"GitHub answered {status}")
    raise PermanentConsumerError(f"GitHub answered {status}: {response.text[:300]}")


def _find_marked(
    client: httpx.Client, path: str, marker: str, before_call: Callable[[], None]
) -> dict[str, Any] | None:
    for page in range(1, MARKER_SEARCH_PAGES + 1):
        before_call()
        response = client.get(path, params={"per_page": 100, "page": page})
        _check(response)
        comments = response.json()
        for comment in comments:
            if marker in (comment.get("body") or ""):
                return comment
        if len(comments) < 100:
            return None
    return None


def source_notify(event: Event) -> Completion:
    # Only the task's source matters here (most tasks have none to comment on): its one
    # column, not the whole row with its JSON fields decoded.
    task_id = event.task_id
    if not task_id:
        return None
    source_ref = Task.objects.filter(pk=task_id).values_list("source_ref", flat=True).first()
    target = github_target(source_ref) if source_ref is not None else None
    if target is None:
        return None
    repo, number = target
    now = timezone.now()
    with transaction.atomic():
        note, _ = Notification.objects.select_for_update().get_or_create(
            event_id=event.id,
            channel=CHANNEL_GITHUB_COMMENT,
            defaults={"target": f"{repo}#{number}"},
        )
        if note.status != Notification.Status.PENDING:
            return None
        if note.lease_until is not None and note.lease_until > now:
            raise NotificationInFlight(
                f"notification {note.pk} is being sent",
                seconds=(note.lease_until - now).total_seconds(),
            )
        Notification.objects.filter(pk=note.pk).update(
            attempts=F("attempts") + 1, lease_until=now + timedelta(seconds=_lease_seconds())
        )
    pr = PullRequest.objects.filter(task_id=task_id).order_by("-updated_at").first()
    path = f"/repos/{repo}/issues/{number}/comments"
    marker = MARKER.format(event_id=event.id)
    calls = 0

    def before_call() -> None:
        # The lease taken above covers the first call; each later one renews it.
        nonlocal calls
        if calls:
            Notification.objects.filter(pk=note.pk).update(
                lease_until=timezone.now() + timedelta(seconds=_lease_seconds())
            )
        calls += 1

    try:
        with _client() as client:
            comment = _find_marked(client, path, marker, before_call) if note.attempts else None
            if comment is None:
                before_call()
                response = client.post(
                    path, json={"body": comment_body(event=event, pr_url=pr.url if pr else "")}
                )
                _check(response)
                comment = response.json()
    except Exception as exc:
        # The call failed before the provider stored anything we know of: let the
        # next attempt in now (it searches for the marker first).
        Notification.objects.filter(pk=note.pk).update(lease_until=None)
        if isinstance(exc, httpx.TransportError):
            raise GitHubUnavailable(f"GitHub unreachable: {exc}") from exc
        raise
    log.info(
        "notification.sent",
        channel=CHANNEL_GITHUB_COMMENT,
        target=f"{repo}#{number}",
        event_id=event.id,
    )

    def mark_sent() -> None:
        Notification.objects.filter(pk=note.pk).update(
            status=Notification.Status.SENT,
            sent_at=timezone.now(),
            lease_until=None,
            external_id=str(comment.get("id", "")),
            external_url=comment.get("html_url", ""),
        )

    return mark_sent


SOURCE_NOTIFICATION = Consumer(
    name="source_notification",
    types=("agent.task.completed", "agent.task.failed", "agent.task.cancelled"),
    handle=source_notify,
)
