"""A page of a list read as plain rows and rendered by the detail serializer's own fields.

A list page needs no model instances and no related objects: each field of the detail's
serializer is read from one column of a ``values()`` query and rendered by that field, so
the list and the detail cannot drift apart while the list costs a fraction per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from rest_framework import serializers


class ListRows:
    """How rows of a list query render as ``serializer_class`` renders one object.

    ``related`` names the column each related field is read from (the related row's key
    or slug itself: what the field renders).
    """

    def __init__(self, serializer_class: type[serializers.Serializer], related: dict[str, str]):
        self.serializer_class = serializer_class
        self.related = related

    @functools.cached_property
    def fields(self) -> list[tuple[str, str, Callable[[Any], Any]]]:
        """(field, column, render) for each field of the serializer, in order."""
        fields: list[tuple[str, str, Callable[[Any], Any]]] = []
        for name, field in self.serializer_class().fields.items():
            if isinstance(field, serializers.RelatedField):
                fields.append((name, self.related[name], _same))
            else:
                fields.append((name, str(field.source), field.to_representation))
        return fields

    @property
    def columns(self) -> list[str]:
        return [column for _, column, _ in self.fields]

    def render(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                name: None if row[column] is None else render(row[column])
                for name, column, render in self.fields
            }
            for row in rows
        ]


def _same(value: Any) -> Any:
    return value
