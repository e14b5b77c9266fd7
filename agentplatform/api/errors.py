"""Every API error as RFC 9457 problem details (``application/problem+json``).

DRF exceptions, refused commands, throttling and Django's own 404/500 under ``/api/``
all leave through ``problem_response``, so a client parses one format.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import ProtectedError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response

from runs.services import (
    ApprovalNotAllowed,
    CommandRefused,
    IdempotencyConflict,
    IdempotencyKeyReserved,
)

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:agentplatform:problem:"
logger = logging.getLogger("agentplatform.api")


class ProblemError(exceptions.APIException):
    """An API error with a stable machine-readable ``code``."""

    def __init__(self, *, status_code: int, code: str, detail: str) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.problem_code = code


def problem_body(
    *, status_code: int, code: str, detail: str, instance: str = "", **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": HTTPStatus(status_code).phrase,
        "status": status_code,
        "detail": detail,
        "code": code,
    }
    if instance:
        body["instance"] = instance
    body.update(extra)
    return body


def _code_of(exc: exceptions.APIException) -> str:
    codes = exc.get_codes()
    if isinstance(codes, str):
        return codes
    return exc.default_code


def _flat_codes(codes: Any) -> list[str]:
    if isinstance(codes, dict):
        return [code for value in codes.values() for code in _flat_codes(value)]
    if isinstance(codes, list):
        return [code for value in codes for code in _flat_codes(value)]
    return [str(codes)]


def _as_api_exception(exc: Exception) -> exceptions.APIException | None:
    if isinstance(exc, IdempotencyConflict):
        return ProblemError(status_code=422, code=exc.code, detail=exc.message)
    if isinstance(exc, IdempotencyKeyReserved):
        return ProblemError(status_code=400, code=exc.code, detail=exc.message)
    if isinstance(exc, ApprovalNotAllowed):
        return ProblemError(status_code=403, code=exc.code, detail=exc.message)
    if isinstance(exc, CommandRefused):
        return ProblemError(status_code=409, code=exc.code, detail=exc.message)
    if isinstance(exc, ProtectedError):
        return ProblemError(
            status_code=409,
            code="protected",
            detail="the object is still referenced and cannot be deleted",
        )
    if isinstance(exc, Http404):
        return exceptions.NotFound()
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        return exc
    return None


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every exception becomes a problem response."""
    request = context.get("request")
    instance = request.path if request is not None else ""
    api_exc = _as_api_exception(exc)
    headers: dict[str, str] = {}
    if api_exc is None:
        logger.exception("api.unhandled_error", extra={"path": instance})
        body = problem_body(
            status_code=500,
            code="server_error",
            detail="an unexpected error occurred",
            instance=instance,
        )
        return Response(body, status=500, content_type=PROBLEM_CONTENT_TYPE)
    if isinstance(api_exc, exceptions.ValidationError):
        errors = api_exc.detail
        if not isinstance(errors, dict):
            errors = {"non_field_errors": errors}
        # Well-formed, but naming something that does not exist (or is not the caller's):
        # 422, so a client can tell a stale reference from a malformed request.
        # A duplicate of an existing unique name: 409, the request itself was fine.
        codes = set(_flat_codes(api_exc.get_codes()))
        status_code, code = {
            frozenset({"does_not_exist"}): (422, "unresolved_reference"),
            frozenset({"unique"}): (409, "conflict"),
        }.get(frozenset(codes), (400, "invalid"))
        body = problem_body(
            status_code=status_code,
            code=code,
            instance=instance,
            detail="the request is invalid; see errors",
            errors=errors,
        )
        return Response(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)
    if isinstance(api_exc, exceptions.Throttled):
        # Throttled.__init__ sets ``wait``; the stubs do not declare it.
        wait: float | None = api_exc.wait  # type: ignore[attr-defined]
        if wait is not None:
            headers["Retry-After"] = str(int(wait) + 1)
    # APIView.handle_exception already chose 401 (with a challenge) or 403.
    auth_header = getattr(api_exc, "auth_header", None)
    if auth_header:
        headers["WWW-Authenticate"] = auth_header
    code = getattr(api_exc, "problem_code", None) or _code_of(api_exc)
    detail = api_exc.detail if isinstance(api_exc.detail, str) else str(api_exc.detail)
    body = problem_body(
        status_code=api_exc.status_code, code=code, detail=str(detail), instance=instance
    )
    return Response(
        body, status=api_exc.status_code, headers=headers, content_type=PROBLEM_CONTENT_TYPE
    )


def problem_json(
    request: HttpRequest,
    *,
    status_code: int,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    """A problem response outside DRF (the SSE view, Django-level handlers)."""
    response = JsonResponse(
        problem_body(status_code=status_code, code=code, detail=detail, instance=request.path),
        status=status_code,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: problem details under /api/, Django's page elsewhere."""
    if _is_api(request):
        return problem_json(request, status_code=404, code="not_found", detail="Not found.")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: problem details under /api/, Django's page elsewhere."""
    if _is_api(request):
        return problem_json(
            request, status_code=500, code="server_error", detail="an unexpected error occurred"
        )
    return defaults.server_error(request)
