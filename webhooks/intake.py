"""Webhook intake: verify, parse and record a delivery, then hand it to processing.

Everything here runs inside the HTTP request and must stay cheap: a few hashes, one
small query for the secrets of the repositories the delivery may belong to, one
transaction that records the receipt and its work item. A delivery reaches only the
repositories whose own secret signed it (docs/design.md §9). The work happens in processing,
woken once the receipt is committed.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction

from jobs import tracing
from jobs.json_input import JSONInputError, json_parse
from jobs.work import work_enqueue, work_enqueue_new
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
        payload = json_parse(text, max_depth=settings.JSON_MAX_DEPTH)
    except UnicodeDecodeError as exc:
        raise IntakeRefused(400, "malformed_payload", f"body is not valid JSON: {exc}") from exc
    except JSONInputError as exc:
        code = "malformed_payload" if exc.code == "malformed_json" else exc.code
        raise IntakeRefused(400, code, exc.detail) from exc
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


def _candidates(
    provider: str, repository_id: int | None, payload: Mapping[str, Any] | None
) -> list[_Candidate]:
    """The secrets that may have signed a delivery: each repository's own.

    On a repository's own URL (``/webhooks/<provider>/<id>/``) that is that repository's
    secret, found without reading the body. On the shared URL it is the secret of every
    repository of the provider that claims the payload's ``external_id``; a claim alone
    proves nothing, so a delivery reaches only those whose secret signed it. At most 50
    claimants are tried (each costs an HMAC of the body); a repository's own URL never
    competes with claimants. The installation-wide secret routes nothing (see
    ``_installation_verified``).
    """
    other = GITLAB if provider == GITHUB else GITHUB
    rows = Repository.objects.exclude(provider=other).exclude(webhook_secret="")
    if repository_id is not None:
        rows = rows.filter(pk=repository_id)
    else:
        external_id = repository_external_id(provider, payload or {})
        if not external_id:
            return []
        rows = rows.filter(external_id=external_id)
    return [
        _Candidate(secret=secret, repository_ids=[pk])
        for pk, secret in rows.order_by("pk").values_list("pk", "webhook_secret")[:50]
    ]


def github_signature(*, secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _signature_refused(provider: str, reason: str, detail: str) -> IntakeRefused:
    metrics.signature_failures.labels(provider=provider, reason=reason).inc()
    log.warning("webhook.signature_refused", provider=provider, reason=reason)
    return IntakeRefused(401, f"signature_{reason}", detail)


def github_signature_check(signature: str) -> None:
    """Refuse (401) a missing or malformed signature before the body is read."""
    if not signature:
        raise _signature_refused(GITHUB, "missing", "X-Hub-Signature-256 header is missing")
    prefix, _, digest = signature.partition("=")
    if prefix != "sha256" or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise _signature_refused(
            GITHUB, "malformed", "X-Hub-Signature-256 must be sha256=<64 hex digits>"
        )


Matches = Callable[[str], bool]


def github_matches(*, body: bytes, signature: str) -> Matches:
    return lambda secret: hmac.compare_digest(github_signature(secret=secret, body=body), signature)


def gitlab_matches(*, token: str) -> Matches:
    return lambda secret: hmac.compare_digest(secret.encode(), token.encode())


def _verified(
    provider: str, candidates: list[_Candidate], matches: Matches, *, tried: bool = False
) -> list[int]:
    """The repositories whose own secret signed the delivery; raises 401 if none did.

    ``tried``: a secret (the installation's) was already compared and did not match.
    """
    if not candidates and not tried:
        raise _signature_refused(provider, "no_secret", "no repository here has a webhook secret")
    matched: list[int] = []
    for candidate in candidates:
        # Every candidate is compared, so timing does not tell which one matched.
        if matches(candidate.secret):
            matched.extend(candidate.repository_ids)
    if not matched:
        raise _signature_refused(provider, "mismatch", "signature does not match")
    return matched


def _installation_verified(provider: str, matches: Matches) -> bool:
    """Whether the installation-wide secret (``GITHUB_WEBHOOK_SECRET`` /
    ``GITLAB_WEBHOOK_TOKEN``) signed a delivery to the shared URL.

    It proves the provider sent the delivery, not which workspace owns the repository
    it names (any workspace can claim an ``external_id``): such a delivery is recorded,
    for the operator to see, and routed to no repository.
    """
    secret = _installation_secret(provider)
    return bool(secret) and matches(secret)


def _installation_secret(provider: str) -> str:
    return str(
        settings.GITHUB_WEBHOOK_SECRET if provider == GITHUB else settings.GITLAB_WEBHOOK_TOKEN
    )


def _verify_and_parse(
    provider: str,
    *,
    body: bytes,
    content_type: str,
    repository_id: int | None,
    matches: Matches,
) -> tuple[dict[str, Any], list[int]]:
    """The payload and the repositories that proved they own the delivery.

    A repository's own URL names the secret: the body is verified before it is parsed.
    The shared URL must read the payload's repository first (unless the installation
    secret signed it); parsing is bounded by the size limit, and nothing is stored or
    routed before a secret matched.
    """
    if repository_id is not None:
        repository_ids = _verified(provider, _candidates(provider, repository_id, None), matches)
        return payload_parse(body=body, content_type=content_type), repository_ids
    if _installation_verified(provider, matches):
        return payload_parse(body=body, content_type=content_type), []
    tried = bool(_installation_secret(provider))
    try:
        payload = payload_parse(body=body, content_type=content_type)
    except IntakeRefused:
        # Nothing verified it, and it names no repository whose secret could: a bad
        # signature, not a bad payload, is all an unauthenticated sender learns.
        raise _signature_refused(provider, "mismatch", "signature does not match") from None
    candidates = _candidates(provider, None, payload)
    return payload, _verified(provider, candidates, matches, tried=tried)


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
    """Insert the receipt and its work item, wake processing on commit; a repeat is a
    duplicate.

    ``repository_ids``: the repositories whose own secret verified the delivery, the
    only ones processing acts on. Two identical deliveries racing each other both try
    the INSERT; the unique constraint makes the second wait for the first to commit and
    then fail, so exactly one receipt (and one processing message) exists per
    (provider, hook, delivery).
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
        # A savepoint inside a caller's transaction: a duplicate leaves it usable.
        with transaction.atomic():
            receipt = WebhookReceipt.objects.create(
                provider=provider,
                delivery_id=delivery_id[:300],
                hook_id=hook_id[:100],
                event=event[:100],
                action=str(action or "")[:100],
                # The delivery's trace (made by the request middleware) goes with the
                # receipt, so processing continues it however late or often it runs.
                headers={**headers_storable(headers), **tracing.traceparent_header()},
                payload=payload,
                repository_ids=sorted(repository_ids),
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
    # Said on the request's own log line (http.response), not on a line of its own.
    structlog.contextvars.bind_contextvars(
        provider=provider, webhook_event=event, delivery_id=delivery_id, receipt_id=receipt.pk
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
    signature = headers.get("X-Hub-Signature-256", "")
    github_signature_check(signature)
    payload, repository_ids = _verify_and_parse(
        GITHUB,
        body=body,
        content_type=content_type,
        repository_id=repository_id,
        matches=github_matches(body=body, signature=signature),
    )
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
    token = headers.get("X-Gitlab-Token", "")
    if not token:
        raise _signature_refused(GITLAB, "missing", "X-Gitlab-Token header is missing")
    payload, repository_ids = _verify_and_parse(
        GITLAB,
        body=body,
        content_type=content_type,
        repository_id=repository_id,
        matches=gitlab_matches(token=token),
    )
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
