"""Model instances from raw rows of a hand-written statement, as the ORM builds them.

For a statement that returns the columns of several models in one row (a join the ORM
reads as ``select_related``, fenced by a lock it cannot express): each model's slice of
the row becomes an instance through its fields' database converters (JSON decoded, and
so on). A statement of one model's columns uses ``Model.objects.raw`` instead.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections


def instance_from_row(model: type[Any], values: Any) -> Any:
    """A model instance from raw column values (``model``'s concrete fields, in order),
    through the fields' database converters."""
    connection = connections[DEFAULT_DB_ALIAS]
    fields = model._meta.concrete_fields
    if len(values) != len(fields):
        raise ValueError(f"{len(values)} values for {len(fields)} columns of {model.__name__}")
    converted = list(values)
    for index, field in enumerate(fields):
        column = field.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
        for convert in converters:
            converted[index] = convert(converted[index], column, connection)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)
