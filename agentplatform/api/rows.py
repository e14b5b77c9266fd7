"""A page of a list read as plain rows and rendered by the detail serializer's own fields.

A list page needs no model instances and no related objects: each field of the detail's
serializer is read from one column of a ``values()`` query and rendered by that field, so
the list and the detail cannot drift apart while the list costs a fraction per row.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import connection, models
from django.utils import timezone
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from jobs.db_rows import Converting, converters_of, row_convert


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
                fields.append((name, str(field.source), _builtin_render(field)))
        return fields

    @functools.cached_property
    def _datetimes(self) -> frozenset[str]:
        """Fields that are date-times in the default ISO 8601 form, in the current zone."""
        return frozenset(
            name
            for name, field in self.serializer_class().fields.items()
            if type(field) is serializers.DateTimeField
            and not hasattr(field, "format")
            and not hasattr(field, "timezone")
            and str(api_settings.DATETIME_FORMAT).lower() == ISO_8601
        )

    @property
    def columns(self) -> list[str]:
        return [column for _, column, _ in self.fields]

    def json_sql(self, columns: list[str]) -> str | None:
        """A select list whose row, as ``row_to_json`` writes it, is the bytes ``render``
        and the compact ``JSONRenderer`` make of the row (its keys and their order,
        escapes, date-times in UTC); None when a field renders in a way SQL does not
        copy. ``columns``: the SQL of each field's column, in the order of ``fields``.

        PostgreSQL escapes a string as Python's ``json`` does without ``ensure_ascii``
        (the two characters a JSON text may hold but JavaScript may not are escaped by
        the renderer over the whole response). Valid for the UTC zone only (``render``
        uses the current one).
        """
        serializer_fields = self.serializer_class().fields
        quote = connection.ops.quote_name
        items: list[str] = []
        for (name, _, _), column in zip(self.fields, columns, strict=True):
            value = _json_value_sql(serializer_fields[name], column, name in self._datetimes)
            if value is None:
                return None
            items.append(f"{value} AS {quote(name)}")
        return ", ".join(items)

    def render(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        # The current time zone is looked up once a page, not once a date-time.
        zone = timezone.get_current_timezone() if settings.USE_TZ else None
        # A related field renders its column as it is: no call at all (render None).
        fields = [
            (
                name,
                column,
                None
                if render is _same
                else _iso_datetime(zone, render)
                if name in self._datetimes
                else render,
            )
            for name, column, render in self.fields
        ]
        return [
            {
                name: value if (value := row[column]) is None or render is None else render(value)
                for name, column, render in fields
            }
            for row in rows
        ]


def _builtin_render(field: serializers.Field) -> Callable[[Any], Any]:
    """The field's ``to_representation``, or the builtin it amounts to for the values of
    its column: half of a list page's rendering was the calls into DRF for these."""
    kind = type(field)
    if kind is serializers.IntegerField:
        return int  # IntegerField.to_representation: int(value)
    if kind is getattr(serializers, "BigIntegerField", None) and not getattr(
        field, "coerce_to_string", api_settings.COERCE_BIGINT_TO_STRING
    ):
        return int
    if kind is serializers.CharField:
        return str
    if kind is serializers.UUIDField and getattr(field, "uuid_format", "") == "hex_verbose":
        return str
    if (
        isinstance(field, serializers.ChoiceField)
        and kind is serializers.ChoiceField
        and all(isinstance(key, str) for key in field.choice_strings_to_values.values())
    ):
        # A string in the choices maps to itself, one outside them is returned as it is.
        return str
    return field.to_representation


def _json_value_sql(field: serializers.Field, column: str, iso_datetime: bool) -> str | None:
    """SQL for a value that ``to_json`` writes as the field renders the column's value
    (NULL stays NULL, which is JSON's null), or None."""
    if isinstance(field, serializers.RelatedField):
        return column  # a key or a slug, rendered as it is: a number or a string
    if iso_datetime:
        # As _iso_datetime in UTC: microseconds, none for a whole second.
        text = f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        return f"replace({text}, '.000000', '') || 'Z'"
    render = _builtin_render(field)
    if render is int:
        return column
    if render is str:
        return f"({column})::text"
    if (
        type(field) is serializers.DecimalField
        and getattr(field, "coerce_to_string", api_settings.COERCE_DECIMAL_TO_STRING)
        and not field.localize
        and not field.normalize_output
        and field.decimal_places is not None
    ):
        # f"{value.quantize(places):f}": a numeric at that scale prints the same.
        return f"round({column}, {int(field.decimal_places)})::text"
    return None


def _iso_datetime(
    zone: datetime.tzinfo | None, fallback: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    """``DateTimeField.to_representation`` for aware date-times, with the zone given."""

    def render(value: Any) -> Any:
        if zone is None or not isinstance(value, datetime.datetime) or value.utcoffset() is None:
            return fallback(value)
        try:
            text = value.astimezone(zone).isoformat()
        except OverflowError:
            return fallback(value)  # the field's own error
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return render


def _same(value: Any) -> Any:
    return value


def rows_as_values(
    model: type[models.Model], columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """Raw rows of ``columns`` (plain field names of ``model``) as ``values()`` returns
    them: each value through its field's database converters (JSON decoded, and so on)."""
    converting = _converters(model, columns)
    return [dict(zip(columns, row_convert(row, converting), strict=True)) for row in rows]


@functools.cache
def _converters(model: type[models.Model], columns: tuple[str, ...]) -> Converting:
    """(index, column, converters) for each of ``columns`` that has converters."""
    return converters_of(model, [model._meta.get_field(name) for name in columns])
