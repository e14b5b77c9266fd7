"""A token-authenticated read names the memberships in the token's own statement only."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from agentplatform.api.auth import ApiTokenAuthentication, api_token_issue
from agentplatform.api.scoping import workspace_ids_for
from runs.models import Membership, Run
from tests.factories import TaskFactory, WorkspaceFactory, member_with_repository

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


MEMBERSHIPS = '"runs_membership"'


def _bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _run_in(workspace, repository=None) -> Run:
    task = TaskFactory(workspace=workspace, **({"repository": repository} if repository else {}))
    return Run.objects.create(task=task, run_no=1)


@pytest.fixture
def caller():
    """A token of a member of two workspaces, each with a run, and a run elsewhere."""
    user, first, repository = member_with_repository()
    second = WorkspaceFactory()
    Membership.objects.create(workspace=second, user=user, role="member")
    mine = {_run_in(first, repository).pk, _run_in(second).pk}
    other = _run_in(WorkspaceFactory()).pk
    _, secret = api_token_issue(user=user, name="ci")
    _bearer(secret).get("/api/runs/")  # the first use records last_used_at
    return user, second, secret, mine, other


def test_a_read_asks_for_the_callers_workspaces_with_the_token(caller) -> None:
    _, _, secret, mine, other = caller
    with CaptureQueriesContext(connection) as queries:
        response = _bearer(secret).get("/api/runs/")
    assert response.status_code == 200
    assert {row["id"] for row in response.json()["results"]} == {str(pk) for pk in mine}
    assert str(other) not in {row["id"] for row in response.json()["results"]}
    statements = [q["sql"] for q in queries.captured_queries]
    asking = [sql for sql in statements if MEMBERSHIPS in sql]
    # One statement names the memberships: the token's, which also reads the token.
    assert len(asking) == 1 and '"runs_apitoken"' in asking[0], statements
    # Then the list's bounded count and its page.
    assert len(statements) == 3, statements


def test_a_request_that_may_change_memberships_asks_for_them_in_one_statement(caller) -> None:
    _, _, secret, _, _ = caller
    request = APIRequestFactory().post("/api/workspaces/")
    request.META["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    authenticated = ApiTokenAuthentication().authenticate(Request(request))
    assert authenticated is not None
    with CaptureQueriesContext(connection) as queries:
        workspace_ids_for(user=authenticated[0])
    assert len(queries.captured_queries) == 1
