"""A list asked for without any filter returns its queryset without building the
filterset; a filter given still goes through it, and an empty one is still a 400."""

from __future__ import annotations

from unittest import mock

import pytest
from rest_framework.test import APIClient

from agentplatform.api.filters import RunFilter, TaskFilter
from runs.models import Membership, Run
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    task = TaskFactory(workspace=workspace, repository=RepositoryFactory(workspace=workspace))
    Run.objects.create(task=task, run_no=1)
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_unfiltered_list_does_not_build_the_filterset(api) -> None:
    with (
        mock.patch.object(RunFilter, "__init__", side_effect=AssertionError("built")),
        mock.patch.object(TaskFilter, "__init__", side_effect=AssertionError("built")),
    ):
        runs = api.get("/api/runs/?limit=10&offset=0")
        tasks = api.get("/api/tasks/")
    assert (runs.status_code, runs.json()["count"]) == (200, 1)
    assert (tasks.status_code, tasks.json()["count"]) == (200, 1)


def test_a_given_filter_still_applies_and_an_empty_one_is_refused(api) -> None:
    assert api.get("/api/runs/?status=completed").json()["count"] == 0
    assert api.get("/api/runs/?status=queued").json()["count"] == 1
    assert api.get("/api/runs/?status=bogus").status_code == 400
    assert api.get("/api/runs/?status=").status_code == 400
