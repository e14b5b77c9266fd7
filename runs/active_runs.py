"""The counts of active runs that admission reads on PostgreSQL (``ActiveRunCount``).

Triggers on runs keep them in the transactions that change runs (migration 0020). What
writes runs with the triggers off (a restore or replication under
``session_replication_role = replica``, ``ALTER TABLE ... DISABLE TRIGGER``) leaves them
wrong; ``recount`` compares them with the runs and, with ``fix``, rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Sum

from runs.models import RUN_TERMINAL_STATUSES, ActiveRunCount, Run
from runs.sql import runs_lock_against_writes


@dataclass(frozen=True)
class Drift:
    workspace_id: int
    repository_id: int  # 0: the workspace's count
    stored: int
    counted: int


def recount(*, fix: bool = False) -> list[Drift]:
    """Where the stored counts differ from the active runs. With ``fix`` the counts are
    rebuilt from the runs: the runs are locked against writes meanwhile (a few
    milliseconds per thousand active runs)."""
    active = Run.objects.exclude(status__in=RUN_TERMINAL_STATUSES)
    with transaction.atomic():
        # Writes of runs wait; the counts and the runs are then read at one moment.
        runs_lock_against_writes()
        counted = {
            (row["workspace_id"], 0): row["n"]
            for row in active.values("workspace_id").annotate(n=Count("pk")).order_by()
        }
        counted |= {
            (row["workspace_id"], row["repository_id"]): row["n"]
            for row in active.values("workspace_id", "repository_id")
            .annotate(n=Count("pk"))
            .order_by()
        }
        stored = {
            (row["workspace_id"], row["repository_id"]): int(row["n"])
            for row in ActiveRunCount.objects.values("workspace_id", "repository_id")
            .annotate(n=Sum("runs"))
            .order_by()
        }
        drift = [
            Drift(ws, repo, stored.get((ws, repo), 0), counted.get((ws, repo), 0))
            for ws, repo in sorted(set(counted) | set(stored))
            if stored.get((ws, repo), 0) != counted.get((ws, repo), 0)
        ]
        if fix and drift:
            ActiveRunCount.objects.all().delete()
            ActiveRunCount.objects.bulk_create(
                ActiveRunCount(workspace_id=ws, repository_id=repo, stripe=-1, runs=n)
                for (ws, repo), n in counted.items()
            )
    return drift
