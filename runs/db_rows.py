"""Model instances from raw rows of a hand-written statement, as the ORM builds them.

Hot paths (a step's lease, a request's token and repository) read their rows with one
fixed statement instead of compiling a queryset each time; the rows still become model
instances through each field's database converters (JSON decoded, and so on).
"""

from __future__ import annotations

from typing import Any

from django.db import connection

# Per (backend, model): the fields' attribute names and, for each field that has any,
# its database converters. Asking every field for its converters on every step cost more
# worker CPU than the lease's round trip.
_ROW_READERS: dict[tuple[str, type[Any]], tuple[list[str], list[tuple[int, Any, list[Any]]]]] = {}


def _row_reader(model: type[Any]) -> tuple[list[str], list[tuple[int, Any, list[Any]]]]:
    key = (connection.vendor, model)
    reader = _ROW_READERS.get(key)
    if reader is None:
        fields = model._meta.concrete_fields
        converting = []
        for index, f in enumerate(fields):
            converters = connection.ops.get_db_converters(f) + f.get_db_converters(connection)
            if converters:
                converting.append((index, f, converters))
        reader = ([f.attname for f in fields], converting)
        _ROW_READERS[key] = reader
    return reader


def instance_from_row(model: type[Any], values: Any) -> Any:
    """A model instance from raw column values, through the fields' database converters."""
    attnames, converting = _row_reader(model)
    if len(values) != len(attnames):
        raise ValueError(f"{len(values)} values for {len(attnames)} columns of {model.__name__}")
    converted = list(values)
    for index, f, converters in converting:
        value = converted[index]
        for convert in converters:
            value = convert(value, f, connection)
        converted[index] = value
    return model.from_db(connection.alias, attnames, converted)
