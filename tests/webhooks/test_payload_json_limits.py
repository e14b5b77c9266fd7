"""A webhook delivery of bad JSON (any depth, NUL, lone surrogates) is a 400 problem,
even when correctly signed, and no receipt or work item is written."""

from __future__ import annotations

import hashlib
import hmac
import uuid

import pytest

from jobs.models import WorkItem
from tests.factories import RepositoryFactory
from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db

SECRET = "per-repository-webhook-secret"


def _deep(depth: int) -> bytes:
    return ('{"action": "opened", "issue": ' + '{"a":' * depth + "1" + "}" * depth + "}").encode()


def _github(client, repository, body: bytes):
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        f"/webhooks/github/{repository.pk}/",
        data=body,
        content_type="application/json",
        headers={
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": signature,
        },
    )


def _gitlab(client, repository, body: bytes):
    return client.post(
        f"/webhooks/gitlab/{repository.pk}/",
        data=body,
        content_type="application/json",
        headers={
            "X-Gitlab-Event": "Issue Hook",
            "X-Gitlab-Event-UUID": str(uuid.uuid4()),
            "X-Gitlab-Token": SECRET,
        },
    )


@pytest.mark.parametrize("send", [_github, _gitlab], ids=["github", "gitlab"])
@pytest.mark.parametrize(
    ("body", "code"),
    [
        (_deep(5_000), "json_too_deep"),
        (_deep(100_000), "json_too_deep"),
        (b'{"action": "opened", "title": "\\u0000"}', "json_unsupported"),
        (b'{"action": "opened", "title": "\\udfff"}', "json_unsupported"),
    ],
    ids=["depth-5000", "depth-100000", "nul", "lone-surrogate"],
)
def test_bad_json_delivery_is_a_400_problem_and_nothing_is_recorded(client, send, body, code):
    repository = RepositoryFactory(
        provider="gitlab" if send is _gitlab else "github", webhook_secret=SECRET
    )

    response = send(client, repository, body)

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code and problem["status"] == 400
    assert problem["type"] == f"urn:agentplatform:problem:{code}"
    assert not WebhookReceipt.objects.exists()
    assert not WorkItem.objects.exists()
