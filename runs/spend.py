"""A workspace's model spend per UTC day, kept as a running total.

The total is added to in the same transaction that stores a model turn, so it is exact
whenever the turn is: a turn stored once counts once, a rolled-back one not at all. The
budget check reads one row by its unique key; its cost does not grow with the number of
runs (summing the day's runs did: every workspace's runs of the day were read).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from runs.models import WorkspaceSpend


def workspace_spend_add(*, workspace_id: int, cost: Decimal, at: datetime | None = None) -> None:
    """Add ``cost`` to the workspace's total of ``at``'s UTC day; call inside the
    transaction that records the cost."""
    if not cost:
        return
    at = at or timezone.now()
    # One statement whichever comes first: concurrent turns of the workspace queue on the
    # row lock and each adds its own cost (no read-modify-write to lose an update).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_workspacespend (workspace_id, day, cost_usd, updated_at) "
            "VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (workspace_id, day) DO UPDATE "
            "SET cost_usd = runs_workspacespend.cost_usd + EXCLUDED.cost_usd, "
            "updated_at = EXCLUDED.updated_at",
            [workspace_id, at.astimezone(UTC).date(), cost, at],
        )


def spend_day() -> date:
    """The UTC day whose spend a budget is held to now."""
    return timezone.now().astimezone(UTC).date()


def workspace_spend_today(*, workspace_id: int) -> Decimal:
    """The workspace's model spend in the current UTC day."""
    day = spend_day()
    spent = WorkspaceSpend.objects.filter(workspace_id=workspace_id, day=day).values_list(
        "cost_usd", flat=True
    )[:1]
    return spent[0] if spent else Decimal("0")
