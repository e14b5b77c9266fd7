"""Deleting a workspace deletes its rows in jobs, which holds the workspace as a plain key."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import EventSubscription, WorkspaceDailyCost
from tests.factories import WorkspaceFactory

pytestmark = pytest.mark.django_db


def test_a_deleted_workspace_takes_its_subscriptions_and_daily_costs_along() -> None:
    gone, kept = WorkspaceFactory(), WorkspaceFactory()
    for workspace in (gone, kept):
        EventSubscription.objects.create(
            workspace_id=workspace.pk, url="http://127.0.0.1:9/hook", secret="s"
        )
        WorkspaceDailyCost.objects.create(workspace_id=workspace.pk, day=timezone.now().date())

    gone.delete()

    assert list(EventSubscription.objects.values_list("workspace_id", flat=True)) == [kept.pk]
    assert list(WorkspaceDailyCost.objects.values_list("workspace_id", flat=True)) == [kept.pk]
