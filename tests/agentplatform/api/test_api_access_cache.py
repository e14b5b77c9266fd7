"""The web processes remember who a token is and which repositories its user may use, and
forget it as soon as PostgreSQL notifies a change, however the change was made: here
always by plain SQL on a connection of its own, as a shell, another host or a
migration would make it, so no signal of this process can have told the cache."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentplatform.api import access_cache
from agentplatform.api.auth import api_token_issue, api_token_resolve
from agentplatform.api.selectors import repository_of_member
from runs.models import ApiToken, Membership
from tests.conftest import wait_for, web_server
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def plain_sql(statement: str, params: list[Any]) -> None:
    """Run ``statement`` on a connection of its own (not Django's), committed."""
    db = settings.DATABASES["default"]
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    ) as other:
        other.execute(statement, params)


@pytest.fixture
def listening() -> Iterator[Callable[[], int]]:
    """Waits until this process's listener is confirmed; yields a function that returns
    the current generation once it has moved past the one given (a change heard)."""
    wait_for(lambda: access_cache.generation() is not None, timeout=30, message="listener")

    def heard_after(before: int) -> int:
        return wait_for(
            lambda: (g := access_cache.generation()) is not None and g > before and g,
            timeout=10,
            interval=0.01,
            message="the change's notification",
        )

    yield heard_after


@pytest.fixture
def member() -> tuple[Any, str, Any]:
    """A user with a token, a member of a workspace with one repository."""
    workspace = WorkspaceFactory()
    repository = RepositoryFactory(workspace=workspace)
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    token, secret = api_token_issue(user=user)
    # The rows' own notifications reach the listener a moment later; a test's first
    # lookup before they arrive would be forgotten when they do.
    written = time.monotonic()
    wait_for(
        lambda: access_cache.generation() is not None and access_cache.heard_since(written),
        timeout=30,
        message="the writes heard",
    )
    return token, secret, repository


def lookups(action: Callable[[], Any]) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as queries:
        result = action()
    return result, len(queries)


def test_a_token_is_answered_from_memory_after_its_first_lookup(listening, member):
    token, secret, repository = member

    first, asked_first = lookups(lambda: api_token_resolve(secret))
    again, asked_again = lookups(lambda: api_token_resolve(secret))
    found, asked_repository = lookups(
        lambda: repository_of_member(user=again.user, repository_id=repository.pk)
    )
    found_again, asked_repository_again = lookups(
        lambda: repository_of_member(user=again.user, repository_id=repository.pk)
    )

    assert first.pk == again.pk == token.pk
    assert again.user.username == token.user.username
    assert asked_first >= 1 and asked_again == 0
    assert found.pk == found_again.pk == repository.pk
    assert found_again.workspace.pk == repository.workspace_id
    assert asked_repository == 1 and asked_repository_again == 0


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE runs_apitoken SET revoked_at = now() WHERE user_id = %s",
        "DELETE FROM runs_apitoken WHERE user_id = %s",
        "UPDATE auth_user SET is_active = false WHERE id = %s",
    ],
    ids=["token revoked", "token deleted", "user deactivated"],
)
def test_a_token_changed_by_plain_sql_is_refused(listening, member, change):
    token, secret, _ = member
    assert api_token_resolve(secret) is not None
    before = access_cache.generation()

    plain_sql(change, [token.user_id])
    listening(before)

    assert api_token_resolve(secret) is None


def test_a_removed_member_no_longer_finds_the_repository(listening, member):
    token, secret, repository = member
    user = api_token_resolve(secret).user
    assert repository_of_member(user=user, repository_id=repository.pk) is not None
    before = access_cache.generation()

    plain_sql("DELETE FROM runs_membership WHERE user_id = %s", [token.user_id])
    listening(before)

    assert repository_of_member(user=user, repository_id=repository.pk) is None


def test_a_changed_workspace_limit_is_read_again(listening, member):
    _, secret, repository = member
    user = api_token_resolve(secret).user
    assert repository_of_member(user=user, repository_id=repository.pk) is not None
    before = access_cache.generation()

    plain_sql(
        "UPDATE runs_workspace SET max_active_runs = 7 WHERE id = %s", [repository.workspace_id]
    )
    listening(before)
    found, asked = lookups(lambda: repository_of_member(user=user, repository_id=repository.pk))

    assert asked == 1
    assert found.workspace.max_active_runs == 7


def test_bookkeeping_writes_do_not_empty_the_memory(listening, member):
    token, secret, _ = member
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=None)
    access_cache.forget_all()
    before = access_cache.generation()

    api_token_resolve(secret)  # writes last_used_at (it was never set)
    plain_sql("UPDATE auth_user SET last_login = now() WHERE id = %s", [token.user_id])
    # A change that notifies, after them: once it is heard, nothing else was.
    plain_sql("UPDATE runs_workspace SET name = name WHERE id = 0", [])
    heard = listening(before)
    again, asked = lookups(lambda: api_token_resolve(secret))

    assert heard == before + 1
    # Remembered again with the time written: no second write within the minute.
    assert asked == 1
    assert again.last_used_at is not None
    assert lookups(lambda: api_token_resolve(secret))[1] == 0


def test_a_lookup_that_raced_a_change_is_not_remembered(listening):
    read_in = access_cache.generation()
    access_cache.forget_all()  # a change heard while the lookup was reading

    access_cache.remember(("token", "raced", False), ("row",), read_in)

    assert access_cache.recall(("token", "raced", False), access_cache.generation()) is None
    assert access_cache.recall(("token", "raced", False), read_in) is None


def test_inside_a_transaction_the_database_is_asked(listening, member):
    _, secret, _ = member
    api_token_resolve(secret)

    with transaction.atomic():
        _, asked = lookups(lambda: api_token_resolve(secret))

    assert asked >= 1


def test_a_change_made_while_the_listener_was_away_is_not_missed(listening, member):
    token, secret, _ = member
    assert api_token_resolve(secret) is not None

    # The listener's connection dies (a restart, a failover) and the token is revoked
    # before it is back: its notification went to nobody.
    plain_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'agentplatform-access-listener'"
        " AND datname = current_database()",
        [],
    )
    wait_for(lambda: access_cache.generation() is None, timeout=10, interval=0.01)
    plain_sql("UPDATE runs_apitoken SET revoked_at = now() WHERE id = %s", [token.pk])

    # Refused while the listener is away (the database is asked), and from memory again
    # once it is back, which starts over.
    refused_away = api_token_resolve(secret) is None
    wait_for(lambda: access_cache.generation() is not None, timeout=30, message="reconnect")

    assert refused_away
    assert api_token_resolve(secret) is None


def _get(url: str, secret: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            json.load(response)
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_server_refuses_a_token_revoked_elsewhere(member):
    """Against the real server (uvicorn, two processes), with entries kept for an hour:
    only the notification can make it refuse."""
    token, secret, _ = member
    with web_server(API_ACCESS_CACHE_SECONDS="3600", WEB_CONCURRENCY="2") as (url, _):
        statuses = [_get(f"{url}/api/tasks/", secret) for _ in range(6)]
        plain_sql("UPDATE runs_apitoken SET revoked_at = now() WHERE id = %s", [token.pk])
        refused = wait_for(
            lambda: all(_get(f"{url}/api/tasks/", secret) == 401 for _ in range(6)),
            timeout=10,
            interval=0.05,
            message="every process to refuse the revoked token",
        )

    assert statuses == [200] * 6
    assert refused
