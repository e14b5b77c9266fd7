"""Approval decisions written as comments (``/agent approve``, ``/agent reject``).

A comment decides as the platform user its author's provider account is linked to
(``runs.ProviderIdentity``), through the same service call as the API and the console,
so one policy holds on every path: the approver role, no self-approval of high-risk
runs, and only the patch that is pending. A refusal is answered on the pull request or
issue, by a work item that posts the reply after the refusal is committed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from jobs.work import PermanentWorkError, work_enqueue
from runs.gitproviders import git_provider_for
from runs.gitproviders.base import GitProviderError
from runs.identities import identity_user
from runs.models import Repository, Run
from runs.services import CommandRefused, run_approve, run_reject
from webhooks.logs import log

REPLY_KIND = "webhook.reply"
# A patch named by the first word after the verb: 7 to 64 hex digits of its SHA-256.
PATCH_PREFIX = re.compile(r"^(?P<sha>[0-9a-fA-F]{7,64})(?:\s+|$)(?P<rest>.*)", re.DOTALL)
REPLY_MARKER = "<!-- agentplatform:reply:{key} -->"


@dataclass
class CommentAuthor:
    """Who wrote the comment: the provider account's id, its ``provider:login`` and when."""

    external_user_id: str
    name: str
    written_at: datetime | None


@dataclass
class ReplyTo:
    """Where an answer to the comment goes: the issue, pull or merge request it is on."""

    repository_id: int
    provider: str
    number: int | None
    merge_request: bool
    key: str


def written_at(value: Any) -> datetime | None:
    """A provider's timestamp (ISO 8601, or GitLab's ``2015-05-17 18:21:36 UTC``)."""
    text = str(value or "").strip()
    if text.endswith(" UTC"):
        text = text[:-4] + "+00:00"
    try:
        return parse_datetime(text)
    except ValueError:
        return None


def commenter_user(
    *,
    repository: Repository,
    provider: str,
    author: CommentAuthor,
    reply: ReplyTo,
    verb: str,
    purpose: str,
) -> tuple[Any, tuple[bool, str] | None]:
    """The platform user the comment's author is linked to, or the refusal (answered on the
    thread) when the account is linked to no member of the repository's workspace."""
    user = identity_user(
        workspace_id=repository.workspace_id,
        provider=provider,
        external_user_id=author.external_user_id,
    )
    if user is not None:
        return user, None
    return None, comment_refused(
        reply,
        verb,
        "identity_not_linked",
        f"{author.name} is not linked to a member of this workspace; link the account "
        f"to {purpose} by comment",
    )


def comment_decide(
    *,
    run: Run,
    repository: Repository,
    provider: str,
    verb: str,
    args: str,
    author: CommentAuthor,
    reply: ReplyTo,
) -> tuple[bool, str]:
    """Decide the run's pending approval as the comment's author; (done, reason)."""
    user, refusal = commenter_user(
        repository=repository,
        provider=provider,
        author=author,
        reply=reply,
        verb=verb,
        purpose="decide",
    )
    if refusal is not None:
        return refusal
    named = PATCH_PREFIX.match(args.strip())
    patch_sha256 = named["sha"].lower() if named else None
    comment = (named["rest"] if named else args).strip()
    decide = run_approve if verb == "approve" else run_reject
    try:
        decide(
            run=run,
            by=user.get_username(),
            comment=comment,
            user=user,
            patch_sha256=patch_sha256,
            # A comment that names no patch speaks for the one pending when it was written.
            seen_at=None if patch_sha256 else author.written_at,
        )
    except CommandRefused as refused:
        return comment_refused(reply, verb, refused.code, refused.message)
    return True, f"/agent {verb} by {user.get_username()} on run {run.run_no}"


def comment_refused(reply: ReplyTo, verb: str, code: str, message: str) -> tuple[bool, str]:
    body = f"`/agent {verb}` was refused ({code}): {message}.\n\n" + REPLY_MARKER.format(
        key=reply.key
    )
    if reply.number is not None:
        work_enqueue(
            kind=REPLY_KIND,
            key=reply.key[:300],
            args={
                "repository_id": reply.repository_id,
                "provider": reply.provider,
                "number": reply.number,
                "merge_request": reply.merge_request,
                "body": body,
            },
        )
    return False, f"/agent {verb} refused: {code}"


def webhook_reply_send(
    *, repository_id: int, provider: str, number: int, merge_request: bool, body: str
) -> str:
    """Post the answer to a comment (the ``webhook.reply`` work item's handler), through
    the client of the provider the comment came from."""
    repository = Repository.objects.filter(pk=repository_id).first()
    if repository is None:
        return "repository gone"
    try:
        git_provider_for(provider).comment_post(
            repository=repository, number=number, body=body, merge_request=merge_request
        )
    except GitProviderError as exc:
        if exc.retryable:
            raise
        raise PermanentWorkError(str(exc)) from exc
    log.info("webhook.reply_sent", repository_id=repository_id, number=number)
    return "sent"
