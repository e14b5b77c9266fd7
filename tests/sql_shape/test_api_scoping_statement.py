"""The caller's workspace ids are read in one statement."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentplatform.api.scoping import workspace_ids_for
from runs.models import Membership
from tests.factories import UserFactory, WorkspaceFactory

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_workspace_ids_are_read_in_one_statement() -> None:
    user = UserFactory()
    for workspace, role in ((WorkspaceFactory(), "admin"), (WorkspaceFactory(), "member")):
        Membership.objects.create(workspace=workspace, user=user, role=role)
    with CaptureQueriesContext(connection) as queries:
        ids = workspace_ids_for(user=user)
    assert len(queries.captured_queries) == 1
    assert len(ids) == 2
