"""OpenAPI generation: problem responses on every operation, readable component names."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import Direction
from rest_framework import serializers

from agentplatform.api.errors import PROBLEM_CONTENT_TYPE


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details."""

    type = serializers.CharField(help_text="URI identifying the problem type")
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="Stable machine-readable error code")
    instance = serializers.CharField(required=False, help_text="The request path")
    # The serializer metaclass moves declared fields off the class, so this does not
    # shadow Serializer.errors at runtime; the stubs cannot know that.
    errors = serializers.DictField(  # type: ignore[assignment]
        required=False,
        child=serializers.JSONField(),
        help_text="Field errors of an invalid request (400 only)",
    )


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "agentplatform.api.auth.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (`manage.py issue_token` or POST /api/tokens/).",
        }


# Which problems any operation may answer, and when.
_COMMON = {
    "401": "Not authenticated, or the token is invalid or revoked.",
    "403": "Authenticated, but the role in the workspace does not allow this.",
    "406": "The Accept header asks for a representation the API does not offer.",
    "429": "Rate limit exceeded; see Retry-After.",
    "500": "Unexpected server error.",
}
_WITH_BODY = {
    "400": "Invalid request (unknown field, wrong type, bad value); `errors` lists them.",
    "409": "Conflicts with the current state or with an existing object (a unique name).",
    "413": "The request body is larger than the API accepts.",
    "415": "The request body is not JSON.",
    "422": "The request names an object that does not exist in the caller's workspaces.",
}
_DETAIL = {"404": "No such object in the caller's workspaces."}


class ProblemAutoSchema(AutoSchema):
    """Adds the problem-details responses to each operation of the API."""

    def _get_response_bodies(self, direction: Direction = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        problem = self.resolve_serializer(ProblemSerializer(), "response").ref
        documented = dict(_COMMON)
        if self.method in ("POST", "PUT", "PATCH"):
            documented.update(_WITH_BODY)
        if self.method == "GET" and self._is_list_view():
            documented["400"] = "Invalid filter or pagination parameter."
        if "{" in self.path or self.method == "POST":
            documented.update(_DETAIL)
        if self.method in ("POST", "PUT", "PATCH", "DELETE"):
            documented["405"] = "Method not allowed."
        for status_code, response in responses.items():
            # Errors declared by an operation (409, 422) without a body are problems too.
            if status_code.startswith(("4", "5")) and "content" not in response:
                response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": problem}}
        for status_code, description in documented.items():
            responses.setdefault(
                status_code,
                {
                    "content": {PROBLEM_CONTENT_TYPE: {"schema": problem}},
                    "description": description,
                },
            )
        return responses

    def get_serializer_name(self, serializer: serializers.Serializer, direction: Direction) -> str:
        # Nested per-operation serializers ("TaskCreateApi.InputSerializer") would all be
        # called "Input"/"Output"; name them after their API class instead.
        name = super().get_serializer_name(serializer, direction)
        qualname = type(serializer).__qualname__
        if "." in qualname:
            outer, inner = qualname.rsplit(".", 1)
            outer = outer.split(".")[-1].removesuffix("Api")
            return outer + inner.removesuffix("Serializer")
        return name


def stream_path_document(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOK: document the SSE endpoint, a plain async Django view."""
    problem = {"$ref": "#/components/schemas/Problem"}
    problem_content = {PROBLEM_CONTENT_TYPE: {"schema": problem}}
    result.setdefault("paths", {})["/api/runs/{id}/stream"] = {
        "get": {
            "operationId": "runs_stream",
            "summary": "The run's timeline as Server-Sent Events",
            "description": (
                "Replays the events after `Last-Event-ID` (a sequence number; also "
                "accepted as the `last_event_id` query parameter), then sends each new "
                "event as it commits, with keep-alive comments, and ends after the run's "
                "terminal event. Each frame: `id` = sequence, `event` = type, `data` = "
                "the event as in `/api/runs/{id}/events/`."
            ),
            "tags": ["runs"],
            "parameters": [
                {
                    "in": "path",
                    "name": "id",
                    "required": True,
                    "schema": {"type": "string", "format": "uuid"},
                },
                {
                    "in": "header",
                    "name": "Last-Event-ID",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                },
                {
                    "in": "query",
                    "name": "last_event_id",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "security": [{"tokenAuth": []}, {"cookieAuth": []}],
            "responses": {
                "200": {
                    "description": "An event stream.",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                "400": {"description": "Invalid Last-Event-ID.", "content": problem_content},
                "401": {"description": "Not authenticated.", "content": problem_content},
                "404": {
                    "description": "No such run in the caller's workspaces.",
                    "content": problem_content,
                },
            },
        }
    }
    return result


# Text never holds NUL (PostgreSQL refuses it); a required text field is stripped of
# surrounding blanks before its length is checked, so it needs one non-blank character.
_NO_NUL = r"^[^\x00]*$"
_NO_NUL_NOT_BLANK = r"^[^\x00]*[^\s\x00][^\x00]*$"
# A decimal as the API reads it: digits, at most one point, at least one digit.
_DECIMAL = r"^-?(\d{1,%d}(\.\d{0,%d})?|\.\d{1,%d})$"


def _string_document(prop: dict[str, Any]) -> None:
    if prop.get("type") != "string" or prop.get("enum") or prop.get("readOnly"):
        return
    if prop.get("format") == "decimal":
        digits = [int(d) for d in re.findall(r"\{0,(\d+)\}", prop.get("pattern") or "")]
        if len(digits) == 2:
            prop["pattern"] = _DECIMAL % (digits[0], digits[1], digits[1])
        return
    if "pattern" in prop or prop.get("format"):
        return
    prop["pattern"] = _NO_NUL_NOT_BLANK if prop.get("minLength", 0) >= 1 else _NO_NUL


def strict_input_document(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOK: publish what the API enforces.

    Request bodies take no fields besides the documented ones (``StrictInput``), and
    pagination takes a limit of at least 1 and a non-negative offset.
    """
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
            for prop in component.get("properties", {}).values():
                _string_document(prop.get("items", prop))
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") != "query":
                    continue
                schema = parameter.get("schema", {})
                if schema.get("type") == "string" and not (
                    schema.get("enum") or schema.get("format") or schema.get("pattern")
                ):
                    # An empty filter is refused (StrictFilterBackend), not ignored.
                    schema["pattern"] = r"^[\s\S]*\S[\s\S]*$"
                if parameter["name"] == "limit":
                    schema.update({"minimum": 1, "maximum": 2**31 - 1})
                elif parameter["name"] in ("offset", "after"):
                    schema.update({"minimum": 0, "maximum": 2**31 - 1})
    return result
