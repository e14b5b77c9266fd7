"""The API's JSON renderer: DRF's, which also takes JSON text already rendered."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rest_framework import renderers
from rest_framework.compat import SHORT_SEPARATORS


class JSONFragment(str):
    """A value's JSON text, rendered already (by PostgreSQL, for a list page): the
    renderer puts it into the response as it is."""

    __slots__ = ()


class JSONRenderer(renderers.JSONRenderer):
    """DRF's ``JSONRenderer``; a top-level dict's ``JSONFragment`` values go in as they
    are when the response is compact, and are parsed and rendered again when the client
    asked for indented JSON (or the settings want ASCII only)."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if not isinstance(data, dict) or not any(
            isinstance(value, JSONFragment) for value in data.values()
        ):
            return super().render(data, accepted_media_type, renderer_context)
        indent = self.get_indent(accepted_media_type or "", renderer_context or {})
        if indent is not None or self.ensure_ascii or not self.compact:
            parsed = {
                key: json.loads(value) if isinstance(value, JSONFragment) else value
                for key, value in data.items()
            }
            return super().render(parsed, accepted_media_type, renderer_context)
        members = []
        for key, value in data.items():
            text = (
                value
                if isinstance(value, JSONFragment)
                else json.dumps(
                    value,
                    cls=self.encoder_class,
                    ensure_ascii=False,
                    allow_nan=not self.strict,
                    separators=SHORT_SEPARATORS,
                )
            )
            members.append(f"{json.dumps(str(key), ensure_ascii=False)}:{text}")
        text = "{" + ",".join(members) + "}"
        # As DRF's renderer: escaped so that the JSON is also a JavaScript literal.
        return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()
