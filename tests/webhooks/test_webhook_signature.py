"""Signatures and tokens: only verified deliveries are stored; refusals leave a counter."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY

from tests.factories import RepositoryFactory
from tests.webhooks.test_webhook_support import (
    CORPUS,
    GITHUB_SECRET,
    GITLAB_TOKEN,
    corpus,
    github_post,
    gitlab_post,
    sign,
)
from webhooks.intake import github_signature
from webhooks.models import WebhookReceipt

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    settings.GITLAB_WEBHOOK_TOKEN = GITLAB_TOKEN


def _refusals(provider: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "agent_webhook_signature_failures_total",
            {"provider": provider, "reason": reason},
        )
        or 0.0
    )


def test_signature_matches_githubs_check_vector():
    assert github_signature(secret="It's a Secret to Everybody", body=b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_valid_signature_is_accepted_and_the_signature_is_not_stored(client):
    payload = json.loads((CORPUS / "github" / "ping" / "payload.json").read_text())
    response = github_post(client, payload, "ping")
    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get(pk=response.json()["receipt_id"])
    stored = {name.lower() for name in receipt.headers}
    assert "x-hub-signature-256" not in stored
    assert "x-github-event" in stored


@pytest.mark.parametrize(
    ("signature", "reason"),
    [
        (None, "missing"),
        ("sha256=" + "0" * 64, "mismatch"),
        ("sha1=abc", "malformed"),
        ("sha256=not-hex-" + "z" * 56, "malformed"),
        ("garbage", "malformed"),
    ],
)
def test_bad_signature_is_refused_with_401_and_nothing_is_stored(client, signature, reason):
    body = json.dumps(corpus("github", "issues/labeled")).encode()
    before = _refusals("github", reason)
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "d-1", "X-GitHub-Hook-ID": "1"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    response = client.post(
        "/webhooks/github/", data=body, content_type="application/json", headers=headers
    )

    assert response.status_code == 401
    assert response.json()["error"] == f"signature_{reason}"
    assert not WebhookReceipt.objects.exists()
    assert _refusals("github", reason) == before + 1


def test_signature_with_another_secret_is_refused(client):
    payload = corpus("github", "issues/opened")
    response = github_post(client, payload, "issues", secret="not-the-secret")
    assert response.status_code == 401
    assert not WebhookReceipt.objects.exists()


def test_signature_over_other_bytes_is_refused(client):
    body = json.dumps(corpus("github", "issues/opened")).encode()
    headers = {
        "X-GitHub-Event": "issues",
        "X-GitHub-Delivery": "d-2",
        "X-Hub-Signature-256": sign(body + b" "),
    }
    response = client.post(
        "/webhooks/github/", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 401


def test_no_secret_configured_refuses_everything(client, settings):
    settings.GITHUB_WEBHOOK_SECRET = ""
    response = github_post(client, corpus("github", "issues/opened"), "issues", secret="")
    assert response.status_code == 401
    assert response.json()["error"] == "signature_no_secret"


def test_repository_secret_verifies_on_its_url_and_on_the_shared_url(client):
    repository = RepositoryFactory(
        external_id="Codertocat/Hello-World", webhook_secret="repository-secret"
    )
    payload = corpus("github", "issues/opened")

    own_url = f"/webhooks/github/{repository.pk}/"

    # Signed with the installation secret on the repository's URL: refused.
    refused = github_post(client, payload, "issues", path=own_url)
    # Signed with the repository's secret: accepted on its URL and on the shared URL.
    shared = github_post(client, payload, "issues", secret="repository-secret")
    accepted = github_post(client, payload, "issues", path=own_url, secret="repository-secret")

    assert refused.status_code == 401
    assert shared.status_code == 202
    assert accepted.status_code == 202
    assert [r.repository_ids for r in WebhookReceipt.objects.order_by("pk")] == [
        [repository.pk],
        [repository.pk],
    ]


def test_the_installation_secret_records_a_delivery_but_routes_it_nowhere(client):
    """It proves the provider sent it, not which workspace owns the repository."""
    RepositoryFactory(external_id="Codertocat/Hello-World")
    RepositoryFactory(external_id="Codertocat/Hello-World", webhook_secret="own-secret")

    response = github_post(client, corpus("github", "issues/opened"), "issues")

    assert response.status_code == 202
    assert WebhookReceipt.objects.get().repository_ids == []


def test_an_unsigned_body_is_refused_before_it_is_parsed_or_anything_is_queried(
    client, django_assert_num_queries
):
    # A body that would make the JSON parser recurse until it gives up.
    body = b"[" * 200_000 + b"]" * 200_000
    with django_assert_num_queries(0):
        response = client.post(
            "/webhooks/github/",
            data=body,
            content_type="application/json",
            headers={
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": "nested",
                "X-Hub-Signature-256": "sha256=" + "0" * 64,
            },
        )
    assert response.status_code == 401
    assert response.json()["error"] == "signature_mismatch"
    assert not WebhookReceipt.objects.exists()


def test_a_signed_body_that_cannot_be_parsed_is_a_clear_400(client):
    body = b"[" * 200_000 + b"]" * 200_000
    response = github_post(client, body, "issues")
    assert response.status_code == 400
    assert response.json()["error"] == "json_too_deep"


@pytest.mark.parametrize(("token", "reason"), [(None, "missing"), ("wrong", "mismatch")])
def test_bad_gitlab_token_is_refused_with_401(client, token, reason):
    response = gitlab_post(client, corpus("gitlab", "issue"), token=token)
    assert response.status_code == 401
    assert response.json()["error"] == f"signature_{reason}"
    assert not WebhookReceipt.objects.exists()


def test_gitlab_token_is_accepted_and_not_stored(client):
    response = gitlab_post(client, corpus("gitlab", "issue"))
    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get()
    assert receipt.provider == "gitlab"
    assert "x-gitlab-token" not in {name.lower() for name in receipt.headers}
