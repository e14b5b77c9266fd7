"""Bad JSON of any depth or size is a 400 problem, and nothing is written."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from agentplatform.api.auth import api_token_issue
from jobs.json_input import json_depth_exceeds
from jobs.models import OutboxEvent
from runs.models import Membership, Run, Task
from tests.conftest import web_server
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory


def _nested(depth: int, kind: str = "object") -> str:
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


def _submission(repository_id: int, model_options: str) -> str:
    return (
        f'{{"repository": {repository_id}, "instruction": "Fix add()", '
        f'"model_options": {model_options}}}'
    )


def _nothing_written() -> None:
    assert not Task.objects.exists()
    assert not Run.objects.exists()
    assert not OutboxEvent.objects.exists()


def _problem(response_status: int, content_type: str, body: dict, code: str) -> None:
    assert response_status == 400, body
    assert content_type == "application/problem+json"
    assert body["status"] == 400
    assert body["code"] == code
    assert body["type"] == f"urn:agentplatform:problem:{code}"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("depth", "kind"), [(5_000, "object"), (100_000, "object"), (100_000, "array")]
)
def test_deeply_nested_model_options_answer_400_and_write_nothing(submitter, depth, kind):
    api, repository = submitter

    response = api.generic(
        "POST",
        "/api/tasks/",
        _submission(repository.pk, _nested(depth, kind)),
        content_type="application/json",
    )

    _problem(response.status_code, response["Content-Type"], response.json(), "json_too_deep")
    _nothing_written()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model_options", "code"),
    [
        ('{"a": "\\u0000"}', "json_unsupported"),  # jsonb cannot hold NUL
        ('{"\\u0000": 1}', "json_unsupported"),
        ('{"a": "\\ud800"}', "json_unsupported"),  # a lone surrogate
        ('{"a": 1e400}', "json_unsupported"),  # an infinity no JSON writer gives back
        ('{"a": NaN}', "json_unsupported"),
        ("[" * 100_000, "json_too_deep"),  # unclosed, and deep before it is malformed
        ("]" * 100_000, "parse_error"),  # unbalanced: never handed to the parser
        ('{"a": 1', "parse_error"),
    ],
)
def test_unstorable_or_malformed_json_answers_400_and_writes_nothing(
    submitter, model_options, code
):
    api, repository = submitter

    response = api.generic(
        "POST",
        "/api/tasks/",
        _submission(repository.pk, model_options),
        content_type="application/json",
    )

    _problem(response.status_code, response["Content-Type"], response.json(), code)
    _nothing_written()


@pytest.mark.django_db
def test_the_depth_limit_is_a_setting_and_json_within_it_is_accepted(submitter, settings):
    api, repository = submitter
    settings.JSON_MAX_DEPTH = 12
    # The body's own object and model_options are two levels; the value nests ten more.
    within = _submission(repository.pk, '{"a": ' + _nested(10, "array") + "}")
    beyond = _submission(repository.pk, '{"a": ' + _nested(11, "array") + "}")

    refused = api.generic("POST", "/api/tasks/", beyond, content_type="application/json")
    accepted = api.generic("POST", "/api/tasks/", within, content_type="application/json")

    assert refused.status_code == 400 and refused.json()["code"] == "json_too_deep"
    assert accepted.status_code == 202, accepted.json()
    assert Task.objects.count() == 1


@pytest.mark.no_services
def test_depth_is_measured_on_the_text_without_recursion():
    assert json_depth_exceeds(b'["]]]]", {"a": "[[[[[["}]', 2) is False
    assert json_depth_exceeds(b'[["\\"]"]]', 2) is False
    assert json_depth_exceeds(b"[[[]]]", 2) is True
    assert json_depth_exceeds(b"[[]", 5) is None
    assert json_depth_exceeds(_nested(1_000_000, "array").encode(), 64) is True


@pytest.mark.django_db(transaction=True)
def test_the_served_api_answers_400_to_a_body_nested_100000_deep():
    """Through uvicorn and its request threads, as a client meets it."""
    workspace = WorkspaceFactory()
    repository = RepositoryFactory(workspace=workspace)
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    _, token = api_token_issue(user=user)
    with web_server() as (url, _):
        for depth in (5_000, 100_000):
            request = urllib.request.Request(  # noqa: S310 - the local test server
                f"{url}/api/tasks/",
                data=_submission(repository.pk, _nested(depth)).encode(),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                method="POST",
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)  # noqa: S310
            body = json.loads(refused.value.read())
            _problem(
                refused.value.code, refused.value.headers["Content-Type"], body, "json_too_deep"
            )
    _nothing_written()
