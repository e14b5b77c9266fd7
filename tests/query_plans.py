"""The plan PostgreSQL picks for a query, with the shortcuts of tiny tables priced out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction


def query_plan(queryset: Any, params: Sequence[Any] = ()) -> str:
    """``EXPLAIN`` of ``queryset`` with sorts and sequential scans priced out.

    On tiny tables a sort or a scan of the whole table is cheapest; priced out, the plan
    shows whether an index serves the query (and its order): with none, the plan still
    has to sort or scan. ``queryset`` may also be a statement's SQL, with its ``params``.
    """
    if not isinstance(queryset, str):
        sql, params = queryset.query.sql_with_params()
    else:
        sql = queryset
    with transaction.atomic(), connection.cursor() as cursor:
        for setting in ("enable_sort", "enable_incremental_sort", "enable_seqscan"):
            cursor.execute(f"SET LOCAL {setting} = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def table_indexes(table: str) -> dict[str, str]:
    """The indexes of ``table``: name -> definition (``pg_indexes``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cursor.fetchall())
