"""The counts of active runs that admission reads on PostgreSQL (``ActiveRunCount``).

Triggers on runs keep them in the transactions that change runs (migration 0020). What
writes runs with the triggers off (a restore or replication under
``session_replication_role = replica``, ``ALTER TABLE ... DISABLE TRIGGER``) leaves them
wrong; ``recount`` compares them with the runs and, with ``fix``, rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from runs.models import RUN_TERMINAL_STATUSES, ActiveRunCount, Run


@dataclass(frozen=True)
class Drift:
    workspace_id: int
    repository_id: int  # 0: the workspace's count
    stored: int
    counted: int


def active_condition_sql(status: str = "status") -> str:
    """A run is active: not terminal, in the words of the run_active index's condition
    (the same values in the same order), which PostgreSQL then matches without a
    proof."""
    terminal = ", ".join(f"'{s}'" for s in RUN_TERMINAL_STATUSES)  # our enum values
    return f"NOT ({status} IN ({terminal}))"


def recount(*, fix: bool = False) -> list[Drift]:
    """Where the stored counts differ from the active runs. With ``fix`` the counts are
    rebuilt from the runs: the runs are locked against writes meanwhile (a few
    milliseconds per thousand active runs)."""
    runs = connection.ops.quote_name(Run._meta.db_table)
    counts = connection.ops.quote_name(ActiveRunCount._meta.db_table)
    active = active_condition_sql()
    counted_sql = (
        f"SELECT workspace_id, 0, COUNT(*) FROM {runs} WHERE {active}"  # noqa: S608
        " GROUP BY workspace_id UNION ALL"
        f" SELECT workspace_id, repository_id, COUNT(*) FROM {runs} WHERE {active}"
        " GROUP BY workspace_id, repository_id"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # Writes of runs wait; the counts and the runs are then read at one moment.
        cursor.execute(f"LOCK TABLE {runs} IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(counted_sql)
        counted = {(ws, repo): n for ws, repo, n in cursor.fetchall()}
        cursor.execute(
            f"SELECT workspace_id, repository_id, SUM(runs) FROM {counts}"  # noqa: S608
            " GROUP BY workspace_id, repository_id"
        )
        stored = {(ws, repo): int(n) for ws, repo, n in cursor.fetchall()}
        drift = [
            Drift(ws, repo, stored.get((ws, repo), 0), counted.get((ws, repo), 0))
            for ws, repo in sorted(set(counted) | set(stored))
            if stored.get((ws, repo), 0) != counted.get((ws, repo), 0)
        ]
        if fix and drift:
            cursor.execute(f"DELETE FROM {counts}")  # noqa: S608
            cursor.execute(
                f"INSERT INTO {counts} (workspace_id, repository_id, stripe, runs)"  # noqa: S608
                f" SELECT ws, repo, -1, n FROM ({counted_sql}) AS counted (ws, repo, n)"
            )
    return drift
