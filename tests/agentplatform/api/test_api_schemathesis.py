"""Property-based: every operation of the live schema, authenticated, answers without
5xx and as documented (status codes, content types, bodies, headers).

Whether a generated request "should" be accepted is not checked: a schema-valid body
naming a workspace that does not exist is rightly refused, which schemathesis cannot
know.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from agentplatform.api.auth import api_token_issue
from agentplatform.wsgi import application
from runs.models import Membership, Run
from tests.factories import RepositoryFactory, TaskFactory, UserFactory, WorkspaceFactory

# The live schema, served by the app itself; the stream stays open until its run ends,
# so it is left to its own tests (test_sse_stream).
schema = schemathesis.openapi.from_wsgi("/api/schema/", application).exclude(
    path="/api/runs/{id}/stream"
)


@pytest.fixture(autouse=True)
def _in_test_transaction(settings):
    settings.API_THROTTLE_USER_RATE = ""
    settings.API_THROTTLE_TOKEN_RATE = ""
    # The app is called straight through WSGI, inside the test's transaction: like
    # Django's test client, keep the request signals from closing that connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(db) -> str:
    workspace = WorkspaceFactory()
    user = UserFactory(is_staff=True)
    Membership.objects.create(workspace=workspace, user=user, role="admin")
    repository = RepositoryFactory(workspace=workspace, provider="github")
    task = TaskFactory(workspace=workspace, repository=repository)
    Run.objects.create(task=task, run_no=1)
    return api_token_issue(user=user)[1]


@schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_operation_conforms_to_the_schema(case, token):
    case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"},
        checks=schemathesis.checks.CHECKS.get_all(),
    )
