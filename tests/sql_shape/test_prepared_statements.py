"""The hot paths' fixed statements are prepared once per connection (cursor_prepared).

PostgreSQL plans a statement it receives as text every time; the API token lookup and
the repository lookup of a submission are run on every request, so they are sent as
server-side prepared statements and executed by name after the first time. The answers
are the same either way, and ``DATABASE_PREPARED_STATEMENTS=0`` sends them as text.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from agentplatform.api.auth import api_token_issue, api_token_resolve
from agentplatform.api.selectors import repository_of_member
from jobs.db_rows import cursor_prepared
from runs.models import Membership, Run
from runs.timeline import event_record
from tests.factories import TaskFactory, UserFactory, api_client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sql_shape]


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def _member(workspace):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.MEMBER)
    return user


def test_the_token_and_repository_lookups_are_prepared_once_and_reused(workspace, repository):
    user = _member(workspace)
    _token, secret = api_token_issue(user=user, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    for _ in range(3):
        assert client.get("/api/workspaces/").status_code == 200
        assert repository_of_member(user=user, repository_id=repository.pk) == repository

    prepared = _prepared()
    tokens = [s for s in prepared if "runs_apitoken" in s]
    repositories = [s for s in prepared if 'FROM "runs_repository" r' in s]
    assert len(tokens) == 1 and len(repositories) == 1, prepared
    assert "$1" in tokens[0], "parameters are bound by the server, not inlined"


def test_the_answers_are_the_same_with_prepared_statements_off(settings, workspace, repository):
    user = _member(workspace)
    token, secret = api_token_issue(user=user, name="ci")
    outsider = UserFactory()
    answers = []
    for prepared in (True, False):
        settings.DATABASE_PREPARED_STATEMENTS = prepared
        answers.append(
            (
                api_token_resolve(secret),
                api_token_resolve(secret[:-1] + "x"),
                repository_of_member(user=user, repository_id=repository.pk),
                repository_of_member(user=outsider, repository_id=repository.pk),
                repository_of_member(user=user, repository_id=repository.pk + 1000),
            )
        )
    assert answers[0] == answers[1] == (token, None, repository, None, None)
    assert answers[0][2].workspace == workspace


def test_with_prepared_statements_off_nothing_is_prepared(settings, workspace, repository):
    settings.DATABASE_PREPARED_STATEMENTS = False
    user = _member(workspace)
    for _ in range(3):
        repository_of_member(user=user, repository_id=repository.pk)
    assert not [s for s in _prepared() if "runs_repository" in s]


def test_a_prepared_statement_error_is_django_s(workspace):
    from django.db import ProgrammingError

    with pytest.raises(ProgrammingError), cursor_prepared() as cursor:
        cursor.execute("SELECT no_such_column FROM runs_workspace WHERE id = %s", [1])


def test_the_reads_answer_alike_with_prepared_statements_off(settings, workspace, repository):
    """The runs list (on its generic plan when prepared) and a run's timeline: the same
    pages either way, and nothing prepared, not even the plan setting, when off."""
    user = _member(workspace)
    runs = []
    for _ in range(3):
        task = TaskFactory(workspace=workspace, repository=repository)
        runs.append(Run.objects.create(task=task, run_no=1))
        with transaction.atomic():
            event_record(task=task, run=runs[-1], type="agent.run.progress", data={"n": 1})
    api = api_client_for(user)
    pages = ["/api/runs/", "/api/runs/?limit=2&offset=1", f"/api/runs/{runs[0].pk}/events/"]
    answers = []
    for prepared in (False, True):
        settings.DATABASE_PREPARED_STATEMENTS = prepared
        if not prepared:
            before = set(_prepared())
        answers.append([api.get(page).json() for page in pages])
        if not prepared:
            assert set(_prepared()) == before
    assert answers[0] == answers[1]
    assert answers[0][0]["count"] == 3 and len(answers[0][1]["results"]) == 2
    assert any("plan_cache_mode" in s for s in _prepared())
