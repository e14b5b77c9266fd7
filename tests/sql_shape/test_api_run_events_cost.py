"""A run's timeline page is two statements (is the run the caller's, and the page),
renders each event exactly as the event serializer does, and a run outside the
caller's workspaces answers 404 as before."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentplatform.api.auth import api_token_issue, api_token_resolve, api_token_revoke
from agentplatform.api.views.runs import RunEventListApi
from runs.models import Run, RunEvent
from runs.timeline import event_record
from tests.factories import (
    TaskFactory,
    UserFactory,
    api_client_for,
    member_with_repository,
)

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


@pytest.fixture
def member_run():
    user, workspace, repository = member_with_repository()
    task = TaskFactory(workspace=workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1)
    with transaction.atomic():
        for n in range(5):
            event_record(task=task, run=run, type="agent.run.progress", data={"n": n, "x": None})
    return user, run


def test_a_page_of_the_timeline_is_two_statements(member_run) -> None:
    user, run = member_run
    api = api_client_for(user)
    with CaptureQueriesContext(connection) as queries:
        response = api.get(f"/api/runs/{run.pk}/events/?limit=2")
    assert response.status_code == 200
    assert len(queries.captured_queries) == 2, [q["sql"] for q in queries.captured_queries]


def test_each_event_is_rendered_as_the_serializer_renders_it(member_run) -> None:
    user, run = member_run
    body = api_client_for(user).get(f"/api/runs/{run.pk}/events/?after=1&limit=3").json()
    events = RunEvent.objects.filter(run=run, sequence_no__gt=1).order_by("sequence_no")[:3]
    expected = json.loads(json.dumps(RunEventListApi.OutputSerializer(events, many=True).data))
    assert body["results"] == expected
    assert body["last_sequence"] == 4
    assert body["next"].endswith(f"/api/runs/{run.pk}/events/?after=4&limit=3")
    last = api_client_for(user).get(f"/api/runs/{run.pk}/events/?after=4").json()
    assert (last["next"], last["last_sequence"], len(last["results"])) == (None, 5, 1)
    empty = api_client_for(user).get(f"/api/runs/{run.pk}/events/?after=9").json()
    assert (empty["next"], empty["last_sequence"], empty["results"]) == (None, 9, [])


def test_an_outsider_gets_404_for_the_timeline(member_run) -> None:
    _, run = member_run
    outsider = api_client_for(UserFactory())
    response = outsider.get(f"/api/runs/{run.pk}/events/")
    missing = outsider.get("/api/runs/00000000-0000-0000-0000-000000000000/events/")
    assert response.status_code == missing.status_code == 404
    body, other = response.json(), missing.json()
    assert body["instance"] == f"/api/runs/{run.pk}/events/"
    assert {**body, "instance": None} == {**other, "instance": None}


def test_a_token_resolves_to_its_user_in_one_statement(member_run) -> None:
    user, _ = member_run
    token, secret = api_token_issue(user=user, name="ci")
    api_token_resolve(secret)  # the first use records last_used_at
    with CaptureQueriesContext(connection) as queries:
        resolved = api_token_resolve(secret)
        assert resolved is not None
        assert (resolved.pk, resolved.user.pk, resolved.user.username) == (
            token.pk,
            user.pk,
            user.username,
        )
        assert resolved.user.is_authenticated and resolved.last_used_at is not None
    assert len(queries.captured_queries) == 1
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert api_token_resolve(secret) is None
    user.is_active = True
    user.save(update_fields=["is_active"])
    api_token_revoke(token=token)
    assert api_token_resolve(secret) is None
    assert api_token_resolve(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None


def test_an_outsider_gets_404_before_the_parameters_are_read(member_run) -> None:
    user, run = member_run
    outsider = api_client_for(UserFactory())
    assert outsider.get(f"/api/runs/{run.pk}/events/?limit=2147483648").status_code == 404
    member = api_client_for(user)
    assert member.get(f"/api/runs/{run.pk}/events/?limit=2147483648").status_code == 400
