"""A workspace's rows in ``jobs``, which keeps the workspace as a plain key
(docs/design.md §2): they go with the workspace, as a foreign key's cascade would take
them."""

from __future__ import annotations

from typing import Any

from jobs.models import EventSubscription, WorkspaceDailyCost
from runs.models import Workspace


def workspace_delivery_rows_delete(sender: Any, instance: Workspace, **kwargs: Any) -> None:
    """Delete the workspace's subscriptions and daily costs; in the deleting transaction
    (connected to ``pre_delete`` of ``Workspace`` by ``RunsConfig.ready``)."""
    EventSubscription.objects.filter(workspace_id=instance.pk).delete()
    WorkspaceDailyCost.objects.filter(workspace_id=instance.pk).delete()
