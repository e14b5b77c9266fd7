"""Webhook intake: verify, parse and record a delivery, then hand it to processing.

Everything here runs inside the HTTP request and must stay cheap: a few hashes, one
small query for the repository's secret, one INSERT. The work happens in processing,
dispatched once the receipt is committed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs import tracing
from runs.models import Repository
from webhooks import metrics
from webhooks.logs import log
from webhooks.models import WebhookReceipt

GITHUB = "github"
GITLAB = "gitlab"

# Never stored: they carry the secret (GitLab) or something derived from it (GitHub).
SENSITIVE_HEADERS = frozenset(
    {
        "x-hub-signature",
        "x-hub-signature-256",
        "x-gitlab-token",
        "authorization",
        "cookie",
        "proxy-authorization",
    }
)


class IntakeRefused(Exception):
    """The delivery is refused; ``status`` and ``code`` become the JSON response."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


@dataclass
class IntakeResult:
    receipt_id: int
    duplicate: bool


@dataclass
class _Candidate:
    secret: str
    repository_ids: list[int] = field(default_factory=list)


# --- parsing ------------------------------------------------------------------------------


def payload_parse(*, body: bytes, content_type: str) -> dict[str, Any]:
    """The JSON object in the body, or in the ``payload`` field of a form-encoded body."""
    try:
        text = body.decode("utf-8")
        if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
            fields = parse_qs(text, keep_blank_values=True, strict_parsing=False)
            if "payload" not in fields:
                raise IntakeRefused(400, "malformed_payload", "form body has no payload field")
            text = fields["payload"][0]
        payload = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise IntakeRefused(400, "malformed_payload", f"body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise IntakeRefused(400, "malformed_payload", "payload must be a JSON object")
    return payload


def repository_external_id(provider: str, payload: Mapping[str, Any]) -> str:
    if provider == GITHUB:
        repo = payload.get("repository")
        return str(repo.get("full_name") or "") if isinstance(repo, dict) else ""
    project = payload.get("project")
    return str(project.get("path_with_namespace") or "") if isinstance(project, dict) else ""


# --- secrets and signatures -----------------------------------------------------------------


def _candidates(provider: str, repository_id: int | None) -> list[_Candidate]:
    """The secrets that may have signed a delivery, chosen without reading its body.

    On a repository's own URL (``/webhooks/<provider>/<id>/``) that is the repository's
    secret, or the environment secret if it has none. On the shared URL it is the
    environment secret alone: a repository with its own secret is reachable only
    through its URL, so no body is parsed and no repository is looked up before a
    signature matched.
    """
    fallback = (
        settings.GITHUB_WEBHOOK_SECRET if provider == GITHUB else settings.GITLAB_WEBHOOK_TOKEN
    )
    if repository_id is None:
        return [_Candidate(secret=fallback)] if fallback else []
    other = GITLAB if provider == GITHUB else GITHUB
    row = (
        Repository.objects.filter(pk=repository_id)
        .exclude(provider=other)
        .values_list("pk", "webhook_secret")
        .first()
    )
    if row is None:
        return []
    pk, secret = row
    return (
        [_Candidate(secret=secret or fallback, repository_ids=[pk])] if secret or fallback else []
    )


def _shared_repositories(provider: str, payload: Mapping[str, Any]) -> list[int]:
    """After the environment secret matched: the repositories that rely on it."""
    external_id = repository_external_id(provider, payload)
    if not external_id:
        return []
    other = GITLAB if provider == GITHUB else GITHUB
    return list(
        Repository.objects.filter(external_id=external_id, webhook_secret="")
        .exclude(provider=other)
        .values_list("pk", flat=True)
    )


def github_signature(*, secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _signature_refused(provider: str, reason: str, detail: str) -> IntakeRefused:
    metrics.signature_failures.labels(provider=provider, reason=reason).inc()
    log.warning("webhook.signature_refused", provider=provider, reason=reason)
    return IntakeRefused(401, f"signature_{reason}", detail)


def github_verify(*, body: bytes, signature: str, repository_id: int | None) -> list[int]:
    """The repositories whose secret signed ``body``; raises 401 if none did."""
    if not signature:
        raise _signature_refused(GITHUB, "missing", "X-Hub-Signature-256 header is missing")
    prefix, _, digest = signature.partition("=")
    if prefix != "sha256" or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise _signature_refused(
            GITHUB, "malformed", "X-Hub-Signature-256 must be sha256=<64 hex digits>"
        )
    candidates = _candidates(GITHUB, repository_id)
    if not candidates:
        raise _signature_refused(GITHUB, "no_secret", "no webhook secret is configured")
    matched: _Candidate | None = None
    for candidate in candidates:
        # Every candidate is compared, so timing does not tell which one matched.
        if hmac.compare_digest(github_signature(secret=candidate.secret, body=body), signature):
            matched = matched or candidate
    if matched is None:
        raise _signature_refused(GITHUB, "mismatch", "signature does not match")
    return matched.repository_ids


def gitlab_verify(*, token: str, repository_id: int | None) -> list[int]:
    """The repositories whose token is ``token``; raises 401 if none matches."""
    if not token:
        raise _signature_refused(GITLAB, "missing", "X-Gitlab-Token header is missing")
    candidates = _candidates(GITLAB, repository_id)
    if not candidates:
        raise _signature_refused(GITLAB, "no_secret", "no webhook token is configured")
    matched: _Candidate | None = None
    for candidate in candidates:
        if hmac.compare_digest(candidate.secret.encode(), token.encode()):
            matched = matched or candidate
    if matched is None:
        raise _signature_refused(GITLAB, "mismatch", "token does not match")
    return matched.repository_ids


# --- the receipt ------------------------------------------------------------------------------


def headers_storable(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in SENSITIVE_HEADERS}


WORK_KIND = "webhook.process"


def receipt_work_enqueue(receipt_id: int, *, reopen: bool = False, new: bool = False) -> None:
    """Record the receipt's processing as a work item (inside the receipt's transaction).

    The row, not the message, is the promise: a refused or lost wake-up is re-sent by
    the work sweep, so an accepted delivery is always processed. ``new``: the receipt
    was inserted in this transaction, so its item cannot exist yet (the intake's path).
    """
    from jobs.work import work_enqueue, work_enqueue_new

    args = {"receipt_id": receipt_id}
    if new:
        work_enqueue_new(kind=WORK_KIND, key=str(receipt_id), args=args)
    else:
        work_enqueue(kind=WORK_KIND, key=str(receipt_id), args=args, reopen=reopen)


def webhook_receipt_record(
    *,
    provider: str,
    event: str,
    hook_id: str,
    delivery_id: str,
    headers: Mapping[str, str],
    payload: dict[str, Any],
    repository_ids: list[int],
    size_bytes: int,
    started: float,
) -> IntakeResult:
    """Insert the receipt and dispatch its processing on commit; a repeat is a duplicate.

    Two identical deliveries racing each other both try the INSERT; the unique constraint
    makes the second wait for the first to commit and then fail, so exactly one receipt
    (and one processing message) exists per (provider, hook, delivery).
    """
    action = (
        payload.get("action")
        if provider == GITHUB
        else (
            (payload.get("object_attributes") or {}).get("action")
            if isinstance(payload.get("object_attributes"), dict)
            else ""
        )
    )
    try:
        with transaction.atomic():
            receipt = WebhookReceipt.objects.create(
                provider=provider,
                event=event[:100],
                action=str(action or "")[:100],
                hook_id=hook_id[:100],
                delivery_id=delivery_id[:300],
                # The delivery's trace (made by the request middleware) goes with the
                # receipt, so processing continues it however late or often it runs.
                headers={**headers_storable(headers), **tracing.traceparent_header()},
                payload=payload,
                repository_ids=repository_ids,
                size_bytes=size_bytes,
                intake_ms=int((time.monotonic() - started) * 1000),
            )
            receipt_work_enqueue(receipt.pk, new=True)
    except IntegrityError:
        existing = (
            WebhookReceipt.objects.filter(
                provider=provider, hook_id=hook_id[:100], delivery_id=delivery_id[:300]
            )
            .values_list("pk", flat=True)
            .first()
        )
        if existing is None:
            raise
        metrics.deliveries.labels(provider=provider, result="duplicate").inc()
        log.info("webhook.duplicate", provider=provider, delivery_id=delivery_id, hook_id=hook_id)
        return IntakeResult(receipt_id=existing, duplicate=True)
    metrics.deliveries.labels(provider=provider, result="accepted").inc()
    log.info(
        "webhook.received",
        provider=provider,
        webhook_event=event,
        delivery_id=delivery_id,
        receipt_id=receipt.pk,
    )
    return IntakeResult(receipt_id=receipt.pk, duplicate=False)


def github_intake(
    *,
    body: bytes,
    headers: Mapping[str, str],
    started: float,
    repository_id: int | None = None,
) -> IntakeResult:
    """Signature, parse, record: the GitHub delivery in ``body`` (size already checked)."""
    content_type = headers.get("Content-Type", "application/json")
    repository_ids = github_verify(
        body=body, signature=headers.get("X-Hub-Signature-256", ""), repository_id=repository_id
    )
    payload = payload_parse(body=body, content_type=content_type)
    if repository_id is None:
        repository_ids = _shared_repositories(GITHUB, payload)
    event = headers.get("X-GitHub-Event", "")
    delivery_id = headers.get("X-GitHub-Delivery", "")
    if not event or not delivery_id:
        raise IntakeRefused(
            400, "missing_headers", "X-GitHub-Event and X-GitHub-Delivery are required"
        )
    return webhook_receipt_record(
        provider=GITHUB,
        event=event,
        hook_id=headers.get("X-GitHub-Hook-ID", ""),
        delivery_id=delivery_id,
        headers=headers,
        payload=payload,
        repository_ids=repository_ids,
        size_bytes=len(body),
        started=started,
    )


def gitlab_intake(
    *,
    body: bytes,
    headers: Mapping[str, str],
    started: float,
    repository_id: int | None = None,
) -> IntakeResult:
    """Token, parse, record: the GitLab delivery in ``body`` (size already checked)."""
    content_type = headers.get("Content-Type", "application/json")
    repository_ids = gitlab_verify(
        token=headers.get("X-Gitlab-Token", ""), repository_id=repository_id
    )
    payload = payload_parse(body=body, content_type=content_type)
    if repository_id is None:
        repository_ids = _shared_repositories(GITLAB, payload)
    event = headers.get("X-Gitlab-Event", "") or str(payload.get("object_kind") or "")
    # Idempotency-Key (GitLab 17.4+) survives retries and manual resends; older servers
    # only send the event UUID.
    delivery_id = headers.get("Idempotency-Key", "") or headers.get("X-Gitlab-Event-UUID", "")
    if not event or not delivery_id:
        raise IntakeRefused(
            400,
            "missing_headers",
            "X-Gitlab-Event and Idempotency-Key or X-Gitlab-Event-UUID are required",
        )
    return webhook_receipt_record(
        provider=GITLAB,
        event=event,
        hook_id=headers.get("X-Gitlab-Webhook-UUID", ""),
        delivery_id=delivery_id,
        headers=headers,
        payload=payload,
        repository_ids=repository_ids,
        size_bytes=len(body),
        started=started,
    )
