"""The API's JSON parser: DRF's, with every kind of bad JSON a 400 problem, never a 500."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from jobs.json_input import JSONInputError, json_parse


class JSONParser(parsers.JSONParser):
    """DRF's ``JSONParser`` reading through ``jobs.json_input.json_parse``: too deep
    (``json_too_deep``), unstorable (``json_unsupported``) and malformed (``parse_error``)
    bodies are refused before any view sees them."""

    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        raw = stream.read() if stream is not None else b""
        try:
            utf8 = encoding.lower() in ("utf-8", "utf8")
            data: bytes | str = raw if utf8 else raw.decode(encoding)
            return json_parse(data, max_depth=settings.JSON_MAX_DEPTH)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}", code="parse_error") from exc
        except JSONInputError as exc:
            code = "parse_error" if exc.code == "malformed_json" else exc.code
            raise ParseError(f"JSON parse error - {exc.detail}", code=code) from exc
