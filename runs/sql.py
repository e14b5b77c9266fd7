"""The statements of ``runs`` that the ORM cannot express, each named, with its reason.

Everything else in ``runs`` goes through the ORM.
"""

from __future__ import annotations

from django.db import connection

from runs.models import Run


def runs_lock_against_writes() -> None:
    """Hold off every write of runs until the transaction ends, reads still going on
    (``LOCK TABLE ... IN SHARE ROW EXCLUSIVE MODE``: the ORM has no table locks), so
    that the active runs and their stored counts are read at one moment."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
