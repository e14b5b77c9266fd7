"""Model instances from raw rows of a hand-written statement, as the ORM builds them, and
model instances as JSON rows for a hand-written INSERT.

Hot paths (a step's lease, a request's token and repository) read their rows with one
fixed statement instead of compiling a queryset each time; the rows still become model
instances through each field's database converters (JSON decoded, and so on).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, models

# (index in the row, column expression, the field's database converters).
Converting = list[tuple[int, Any, list[Any]]]

# Per (backend, model): the fields' attribute names and, for each field that has any,
# its database converters. Asking every field for its converters on every step cost more
# worker CPU than the lease's round trip.
_ROW_READERS: dict[tuple[str, type[Any]], tuple[list[str], Converting]] = {}


def converters_of(model: type[Any], fields: Any) -> Converting:
    """(index, column, converters) for each of ``fields`` (of ``model``, in row order)
    that has database converters on the current connection's backend."""
    converting = []
    for index, f in enumerate(fields):
        # The backend's converters take a column expression, as the ORM gives them
        # (SQLite's read its output_field: a bare field failed there).
        column = f.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(column) + f.get_db_converters(connection)
        if converters:
            converting.append((index, column, converters))
    return converting


def row_convert(values: Any, converting: Converting) -> list[Any]:
    """A raw row's values as the ORM reads them: each through its field's converters."""
    converted = list(values)
    for index, column, converters in converting:
        value = converted[index]
        for convert in converters:
            value = convert(value, column, connection)
        converted[index] = value
    return converted


def _row_reader(model: type[Any]) -> tuple[list[str], Converting]:
    key = (connection.vendor, model)
    reader = _ROW_READERS.get(key)
    if reader is None:
        fields = model._meta.concrete_fields
        reader = ([f.attname for f in fields], converters_of(model, fields))
        _ROW_READERS[key] = reader
    return reader


def instance_from_row(model: type[Any], values: Any) -> Any:
    """A model instance from raw column values, through the fields' database converters."""
    attnames, converting = _row_reader(model)
    if len(values) != len(attnames):
        raise ValueError(f"{len(values)} values for {len(attnames)} columns of {model.__name__}")
    return model.from_db(connection.alias, attnames, row_convert(values, converting))


# Per model: how each concrete field's value goes into a JSON row (see ``row_json``).
_JSON_WRITERS: dict[type[Any], list[tuple[str, str, str]]] = {}


def _json_writer(model: type[Any]) -> list[tuple[str, str, str]]:
    writer = _JSON_WRITERS.get(model)
    if writer is None:
        writer = []
        for f in model._meta.concrete_fields:
            target = f.target_field if f.is_relation else f
            if isinstance(target, models.DateTimeField):
                stamped = not f.is_relation and (f.auto_now or f.auto_now_add)
                kind = "now" if stamped else "datetime"
            elif isinstance(target, models.UUIDField | models.DecimalField):
                kind = "str"
            elif isinstance(
                target,
                models.JSONField
                | models.CharField
                | models.TextField
                | models.IntegerField
                | models.BooleanField,
            ):
                kind = "value"  # JSON holds these as they are
            else:
                raise TypeError(f"{model.__name__}.{f.name}: no JSON form for this field")
            writer.append((f.attname, f.column, kind))
        _JSON_WRITERS[model] = writer
    return writer


def row_json(instance: Any, now: datetime) -> dict[str, Any]:
    """Every column of ``instance`` as a JSON object for ``jsonb_populate_record``.

    Values are what the instance holds (its defaults applied by the constructor);
    ``auto_now``/``auto_now_add`` fields take ``now`` and the instance is given it, as
    saving would. JSON fields go in as JSON, so PostgreSQL stores what the ORM would.
    """
    row: dict[str, Any] = {}
    for attname, column, kind in _json_writer(type(instance)):
        value = getattr(instance, attname)
        if kind == "now":
            value = now
            setattr(instance, attname, now)
        if value is not None and kind in ("now", "datetime"):
            value = value.isoformat()
        elif value is not None and kind == "str":
            value = str(value)
        row[column] = value
    return row
