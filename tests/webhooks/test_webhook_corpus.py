"""Every real payload in the corpus is accepted and processed without error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runs.models import PullRequest
from tests.factories import RepositoryFactory, TaskFactory
from tests.webhooks.test_webhook_support import (
    CORPUS,
    GITHUB_SECRET,
    GITLAB_EVENTS,
    GITLAB_TOKEN,
    REPOSITORY_SECRET,
    sign,
)
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db

GITHUB_FILES = sorted((CORPUS / "github").glob("*/*.json"))
GITLAB_FILES = sorted((CORPUS / "gitlab").glob("*.json"))
MAPPED_GITHUB = "Codertocat/Hello-World"
MAPPED_GITLAB = ("gitlabhq/gitlab-test", "gitlab-org/gitlab-test")


@pytest.fixture(autouse=True)
def mapped(settings):
    """Repositories the corpus names, with an agent PR on the corpus' PR branch and head,
    so the CI, review and pull request payloads reach the deeper paths."""
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    settings.GITLAB_WEBHOOK_TOKEN = GITLAB_TOKEN
    settings.GITLAB_COMMAND_USERS = ["root"]
    repository = RepositoryFactory(
        external_id="Codertocat/Hello-World", webhook_secret=REPOSITORY_SECRET
    )
    task = TaskFactory(repository=repository, workspace=repository.workspace)
    PullRequest.objects.create(
        task=task,
        provider="local",
        branch="changes",
        base_branch="main",
        number=2,
        head_sha="ec26c3e57ca3a959ca5aad62de7213c562f8c821",
    )
    for external_id in MAPPED_GITLAB:
        RepositoryFactory(
            external_id=external_id, provider="gitlab", webhook_secret=REPOSITORY_SECRET
        )


def _secret(payload: dict) -> str:
    """The mapped repository's own secret (the delivery then reaches it), else the
    installation's (recorded, routed nowhere)."""
    named = (payload.get("repository") or {}).get("full_name") or (
        payload.get("project") or {}
    ).get("path_with_namespace")
    mapped = named in (MAPPED_GITHUB, *MAPPED_GITLAB)
    return REPOSITORY_SECRET if mapped else GITHUB_SECRET


def _processed(response) -> WebhookReceipt:
    assert response.status_code == 202, response.content
    receipt_id = response.json()["receipt_id"]
    webhook_receipt_process(receipt_id=receipt_id)
    receipt = WebhookReceipt.objects.get(pk=receipt_id)
    assert receipt.status in {WebhookReceipt.Status.PROCESSED, WebhookReceipt.Status.IGNORED}, (
        receipt.status_reason,
        receipt.error,
    )
    assert receipt.error == ""
    return receipt


@pytest.mark.parametrize("path", GITHUB_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_github_payload_is_accepted_and_processed(client, path: Path):
    body = path.read_bytes()  # the pretty-printed file bytes, signed exactly as sent
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers={
            "X-GitHub-Event": path.parent.name,
            "X-GitHub-Delivery": path.name,
            "X-GitHub-Hook-ID": "7",
            "X-Hub-Signature-256": sign(body, _secret(json.loads(body))),
        },
    )
    receipt = _processed(response)
    assert receipt.event == path.parent.name
    assert bool(receipt.repository_ids) == (_secret(json.loads(body)) == REPOSITORY_SECRET)


@pytest.mark.parametrize("path", GITLAB_FILES, ids=lambda p: p.name)
def test_gitlab_payload_is_accepted_and_processed(client, path: Path):
    body = path.read_bytes()
    payload = json.loads(body)
    kind = payload["object_kind"]
    response = client.post(
        "/webhooks/gitlab/",
        data=body,
        content_type="application/json",
        headers={
            "X-Gitlab-Event": GITLAB_EVENTS[kind],
            "X-Gitlab-Token": GITLAB_TOKEN
            if _secret(payload) == GITHUB_SECRET
            else REPOSITORY_SECRET,
            "X-Gitlab-Event-UUID": f"uuid-{path.name}",
            "Idempotency-Key": path.name,
        },
    )
    receipt = _processed(response)
    assert receipt.delivery_id == path.name
    assert bool(receipt.repository_ids) == (_secret(payload) == REPOSITORY_SECRET)
