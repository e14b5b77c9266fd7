"""Idempotency keys the platform derives from provider events (``github:issue:octo/h2#7``)
are its own: the API refuses them with a 400 problem body, so a client cannot make the
real issue #7 be ignored later."""

from __future__ import annotations

import pytest

from runs.models import Task
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "key",
    ["github:issue:octo/h2#7", "gitlab:issue:group/calc#7", "GitHub:issue:octo/h2#7"],
)
def test_a_key_in_the_reserved_namespace_is_refused(submitter, key):
    api, repository = submitter

    response = api.post(
        "/api/tasks/",
        {"repository": repository.pk, "instruction": "Fix add()"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_key_reserved"
    assert not Task.objects.exists()


def test_the_real_issue_is_not_shadowed_by_an_api_submission(submitter, client):
    api, repository = submitter
    repository.provider = "github"
    repository.external_id = "octo/h2"
    repository.webhook_secret = REPOSITORY_SECRET
    repository.save()
    refused = api.post(
        "/api/tasks/",
        {"repository": repository.pk, "instruction": "Not the issue"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="github:issue:octo/h2#7",
    )
    issue = corpus("github", "issues/labeled")
    issue["label"]["name"] = "agent"
    issue["repository"]["full_name"] = "octo/h2"
    issue["issue"]["number"] = 7

    receipt = github_post(client, issue, "issues", secret=REPOSITORY_SECRET).json()["receipt_id"]
    status = webhook_receipt_process(receipt_id=receipt)

    assert refused.status_code == 400
    assert status == "processed"
    task = Task.objects.get()
    assert (task.source, task.idempotency_key) == ("webhook", "github:issue:octo/h2#7")
    assert task.instruction.startswith(issue["issue"]["title"])


def test_an_ordinary_key_still_replays(submitter):
    api, repository = submitter
    body = {"repository": repository.pk, "instruction": "Fix add()"}
    first = api.post("/api/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="githubby:7")
    again = api.post("/api/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="githubby:7")
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["task_id"] == again.json()["task_id"]
    assert Task.objects.count() == 1
