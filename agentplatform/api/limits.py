"""Request bodies over the API's size limit answer 413 problem details before any parsing."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from agentplatform.api.errors import problem_json

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ApiBodyLimitMiddleware:
    """Refuse ``/api/`` bodies above ``API_MAX_BODY_BYTES`` with 413.

    The declared length is checked first, so an honest client is refused without its
    body being read; a chunked body (no length) is measured once it has arrived.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in BODY_METHODS and request.path.startswith("/api/"):
            refused = self._refuse(request)
            if refused is not None:
                return refused
        return self.get_response(request)

    def _refuse(self, request: HttpRequest) -> HttpResponse | None:
        limit: int = settings.API_MAX_BODY_BYTES
        declared = request.META.get("CONTENT_LENGTH") or ""
        if declared.strip():
            try:
                length = int(declared)
            except ValueError:
                return problem_json(
                    request, status_code=400, code="bad_content_length", detail="bad Content-Length"
                )
        else:
            length = len(request.body)
        if length <= limit:
            return None
        return problem_json(
            request,
            status_code=413,
            code="payload_too_large",
            detail=f"request body is {length} bytes; the limit is {limit}",
        )
