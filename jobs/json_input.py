"""JSON from outside (API bodies, webhook deliveries), refused cleanly when it is bad.

The standard library's parser recurses once per nesting level and raises RecursionError
(not ValueError) past about a thousand levels; PostgreSQL refuses ``\\u0000`` and lone
surrogates in ``jsonb``; ``1e400`` parses as an infinity no JSON writer can give back.
Each of those answered 500 somewhere. ``json_parse`` refuses all of them before anything
is stored, with a code a client can act on; the nesting depth is measured on the text
itself, without recursion, so no depth or size of input can exhaust the stack.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput

# A JSON string: the quotes and everything between them (escapes included).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")
# An escape PostgreSQL's jsonb refuses: NUL, or a surrogate that is not half of a pair.
# The leading run of backslashes must be even, or the backslash itself was escaped.
_UNSTORABLE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|"
    r"d[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)
_PAIRED_LOW = re.compile(r"(?<!\\)(?:\\\\)*\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}", re.I)


class JSONInputError(ValueError):
    """The text is not JSON this platform accepts; ``code`` says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def json_depth_exceeds(data: bytes, limit: int) -> bool | None:
    """True when ``data`` nests arrays and objects deeper than ``limit``, None when its
    brackets do not balance (it cannot be JSON), else False.

    Strings are cut out first (a bracket inside one is text); what is left is only
    brackets, and each pass removes the innermost empty pairs, one level per pass. At
    most ``limit`` passes over a text that only shrinks: linear in the size, no stack.
    """
    skeleton = _STRING.sub(b"", data).translate(_SQUARE, _NOT_BRACKETS)
    if b"[" * (limit + 1) in skeleton:  # the usual attack, found in one scan
        return True
    for _ in range(limit):
        if not skeleton:
            return False
        shorter = skeleton.replace(b"[]", b"")
        if len(shorter) == len(skeleton):
            return None
        skeleton = shorter
    return bool(skeleton)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONInputError("json_unsupported", f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise JSONInputError("json_unsupported", f"{name} is not a JSON value")


def _unstorable_escape(text: str) -> str | None:
    if "\\u" not in text and "\\U" not in text:
        return None
    # Pairs are fine; take them out so their low half is not seen as a lone one.
    match = _UNSTORABLE_ESCAPE.search(_PAIRED_LOW.sub("", text))
    return match.group(0).lstrip("\\") if match else None


def json_parse(data: bytes | str, *, max_depth: int) -> Any:
    """The value in ``data`` (UTF-8 when bytes); raises JSONInputError with code
    ``json_too_deep``, ``json_unsupported`` or ``malformed_json``."""
    try:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        text = raw.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeError as exc:
        raise JSONInputError("malformed_json", f"the body is not UTF-8: {exc}") from exc
    deep = json_depth_exceeds(raw, max_depth)
    if deep:
        raise JSONInputError(
            "json_too_deep", f"the JSON nests deeper than {max_depth} arrays or objects"
        )
    if deep is None:
        raise JSONInputError("malformed_json", "the JSON's brackets do not balance")
    escape = _unstorable_escape(text)
    if escape:
        raise JSONInputError(
            "json_unsupported", f"the escape \\{escape} (NUL or a lone surrogate) is not accepted"
        )
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_constant)
    except JSONInputError:
        raise
    except (ValueError, RecursionError) as exc:
        raise JSONInputError("malformed_json", f"the body is not valid JSON: {exc}") from exc


class BoundedJSONFormField(forms.JSONField):
    """Django's form ``JSONField`` (the admin's) reading through ``json_parse``: bad
    JSON is a form error, never a RecursionError or a refused database write."""

    def _refusal(self, value: Any) -> JSONInputError | None:
        if self.disabled or not isinstance(value, str) or value in self.empty_values:
            return None
        try:
            json_parse(value, max_depth=settings.JSON_MAX_DEPTH)
        except JSONInputError as exc:
            return exc
        return None

    def to_python(self, value: Any) -> Any:
        refused = self._refusal(value)
        if refused is not None:
            raise ValidationError(refused.detail, code=refused.code)
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        # The form shows what was sent again; Django's own would parse it unguarded.
        if self._refusal(data) is not None:
            return InvalidJSONInput(data)
        return super().bound_data(data, initial)
