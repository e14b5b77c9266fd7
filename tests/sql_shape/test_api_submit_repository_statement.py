"""A submission's repository and its workspace are read in one statement."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentplatform.api.selectors import repository_of_member
from tests.factories import member_with_repository

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def test_the_repository_and_its_workspace_are_one_statement() -> None:
    user, workspace, repository = member_with_repository()
    with CaptureQueriesContext(connection) as queries:
        found = repository_of_member(user=user, repository_id=repository.pk)
        assert found is not None
        assert found.workspace.slug == workspace.slug
    assert len(queries.captured_queries) == 1
