"""What admission reads: each workspace's model spend per day and its active runs."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    pass
from runs.models.tenants import Workspace


class WorkspaceSpend(models.Model):
    """Model spend of a workspace in one UTC day: what its daily cost budget is held to.

    Added to in the transaction that stores the model turn (``workspace_spend_add``), so
    a turn's cost counts exactly when the turn is stored: a turn whose transaction rolls
    back (a lost lease, a second attempt at the same turn) adds nothing. Admission reads
    one row by its unique key, whatever the number of runs. (``jobs.WorkspaceDailyCost``
    is the report the cost consumer sums from the events, tokens and turns included;
    it trails the commits by the relay's lag, so budgets are not held to it.)
    """

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="spend", db_index=False
    )
    day = models.DateField()
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "day"], name="workspace_spend_day"),
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id} {self.day}: ${self.cost_usd}"


class ActiveRunCount(models.Model):
    """Active runs of a workspace (``repository_id`` 0) or of one of its repositories: the
    sum of the rows of every ``stripe``. What admission reads on PostgreSQL, in place of a
    scan of the active runs that grew with their number.

    Written only by the triggers on runs (migration 0020), in the transaction that inserts
    a run, moves it between an active and a terminal status or deletes it, so the sum at
    any snapshot is the count of the active runs at that snapshot. A submission that holds
    an admission lane adds to its lane's stripe, which nobody else holding a lane of the
    workspace writes; other writers add to a stripe of their backend's, so concurrent
    submissions and run ends do not wait on one row. No foreign keys: the rows of a
    deleted workspace are left at zero.
    """

    pk = models.CompositePrimaryKey("workspace_id", "repository_id", "stripe")
    workspace_id = models.BigIntegerField()
    repository_id = models.BigIntegerField()
    stripe = models.SmallIntegerField()
    runs = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.repository_id}/{self.stripe}: {self.runs}"
