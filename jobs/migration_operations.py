"""Index operations that keep a busy table writable while they run.

On PostgreSQL an index is built and dropped ``CONCURRENTLY``: a plain ``CREATE INDEX``
blocks every insert into the table until it has read all of it, and the outbox takes an
insert with every step and submission. Elsewhere (the embedded SQLite) they are the plain
operations. A migration using them sets ``atomic = False``.
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres import operations as postgres
from django.db.migrations.operations import AddIndex, RemoveIndex


class _ConcurrentlyOnPostgres:
    """The concurrent operation on PostgreSQL, ``plain`` on any other database."""

    plain: Any

    def database_forwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, *states)  # type: ignore[misc]
        else:
            self.plain.database_forwards(self, app_label, schema_editor, *states)

    def database_backwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, *states)  # type: ignore[misc]
        else:
            self.plain.database_backwards(self, app_label, schema_editor, *states)


class AddIndexConcurrently(_ConcurrentlyOnPostgres, postgres.AddIndexConcurrently):
    plain = AddIndex


class RemoveIndexConcurrently(_ConcurrentlyOnPostgres, postgres.RemoveIndexConcurrently):
    plain = RemoveIndex
