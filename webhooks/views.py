"""HTTP endpoints for Git provider webhooks: check size, hand to intake, answer at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webhooks import intake, metrics
from webhooks.logs import log

Intake = Callable[..., intake.IntakeResult]


def _refusal(provider: str, refused: intake.IntakeRefused) -> JsonResponse:
    if refused.status != 401:  # signature refusals are counted by intake already
        metrics.deliveries.labels(provider=provider, result=refused.code).inc()
        log.info("webhook.refused", provider=provider, code=refused.code, status=refused.status)
    # RFC 9457 problem details, as the API answers; ``error`` is the code's older name.
    body = {
        "type": f"urn:agentplatform:problem:{refused.code}",
        "title": HTTPStatus(refused.status).phrase,
        "status": refused.status,
        "detail": refused.detail,
        "code": refused.code,
        "error": refused.code,
    }
    return JsonResponse(body, status=refused.status, content_type="application/problem+json")


def _body_read(request: HttpRequest) -> bytes:
    """The raw body, refused with 413 above WEBHOOK_MAX_BYTES.

    Content-Length is checked before reading anything; the stream is then read at most
    one byte past the limit, so a lying or missing Content-Length cannot make us buffer
    more. ``request.body`` is not used: Django caps it at DATA_UPLOAD_MAX_MEMORY_SIZE
    (2.5 MB), below what providers legitimately send.
    """
    limit = settings.WEBHOOK_MAX_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise intake.IntakeRefused(413, "payload_too_large", f"payload exceeds {limit} bytes")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise intake.IntakeRefused(413, "payload_too_large", f"payload exceeds {limit} bytes")
    return body


def _receive(
    request: HttpRequest, provider: str, accept: Intake, repository_id: int | None
) -> JsonResponse:
    started = time.monotonic()
    try:
        body = _body_read(request)
        result = accept(
            body=body, headers=request.headers, started=started, repository_id=repository_id
        )
    except intake.IntakeRefused as refused:
        return _refusal(provider, refused)
    metrics.intake_seconds.labels(provider=provider).observe(time.monotonic() - started)
    if result.duplicate:
        return JsonResponse({"status": "duplicate", "receipt_id": result.receipt_id}, status=200)
    return JsonResponse({"status": "accepted", "receipt_id": result.receipt_id}, status=202)


@csrf_exempt
@require_POST
def github(request: HttpRequest, repository_id: int | None = None) -> JsonResponse:
    return _receive(request, intake.GITHUB, intake.github_intake, repository_id)


@csrf_exempt
@require_POST
def gitlab(request: HttpRequest, repository_id: int | None = None) -> JsonResponse:
    return _receive(request, intake.GITLAB, intake.gitlab_intake, repository_id)
