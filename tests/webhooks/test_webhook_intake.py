"""Intake: size limit, parsing, form bodies, unknown events, dispatch on commit."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from tests.webhooks.test_webhook_support import GITHUB_SECRET, corpus, github_headers, github_post
from webhooks.models import WebhookReceipt
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def test_oversize_payload_is_refused_with_413_before_reading(client, settings):
    settings.WEBHOOK_MAX_BYTES = 1000
    body = json.dumps({"zen": "x" * 2000}).encode()
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, "ping"),
    )
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert not WebhookReceipt.objects.exists()


def test_payload_at_the_limit_is_accepted(client, settings):
    body = json.dumps({"zen": "x"}).encode()
    settings.WEBHOOK_MAX_BYTES = len(body)
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, "ping"),
    )
    assert response.status_code == 202


def test_payload_above_djangos_upload_limit_is_accepted(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"zen": "x" * 5000}).encode()
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, "ping"),
    )
    assert response.status_code == 202


def test_malformed_json_is_refused_with_400(client):
    body = b'{"action": "opened", '
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, "issues"),
    )
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_payload"
    assert not WebhookReceipt.objects.exists()


def test_json_that_is_not_an_object_is_refused_with_400(client):
    body = b"[1, 2, 3]"
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, "issues"),
    )
    assert response.status_code == 400


def test_malformed_body_with_a_bad_signature_is_a_401_not_a_400(client):
    body = b"{not json"
    headers = github_headers(body, "issues", secret="wrong")
    response = client.post(
        "/webhooks/github/", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 401


def test_form_encoded_body_is_parsed_from_its_payload_field(client):
    payload = corpus("github", "issues/opened")
    body = urlencode({"payload": json.dumps(payload)}).encode()
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=github_headers(body, "issues"),
    )
    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get()
    assert receipt.payload == payload
    assert receipt.action == "opened"


def test_form_encoded_body_without_payload_is_refused(client):
    body = b"other=1"
    response = client.post(
        "/webhooks/github/",
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=github_headers(body, "issues"),
    )
    assert response.status_code == 400


def test_missing_delivery_header_is_refused(client):
    body = b"{}"
    headers = github_headers(body, "ping")
    del headers["X-GitHub-Delivery"]
    response = client.post(
        "/webhooks/github/", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 400


def test_get_is_not_allowed(client):
    assert client.get("/webhooks/github/").status_code == 405


def test_processing_is_dispatched_only_on_commit(client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = github_post(client, corpus("github", "issues/opened"), "issues")
    assert response.status_code == 202
    # The receipt's own dispatch (the test client runs outside a request transaction).
    assert len(callbacks) == 1


@pytest.mark.parametrize(
    ("event", "payload"),
    [
        ("marketplace_purchase", {"action": "purchased", "sender": {"login": "x"}}),
        ("issues", {"action": "brand_new_action", "issue": {"number": 1}}),
    ],
)
def test_unknown_events_and_actions_are_recorded_and_ignored(client, event, payload):
    response = github_post(client, payload, event)
    assert response.status_code == 202
    receipt = WebhookReceipt.objects.get()
    assert webhook_receipt_process(receipt_id=receipt.pk) == "ignored"
    receipt.refresh_from_db()
    assert receipt.status == WebhookReceipt.Status.IGNORED
    assert receipt.status_reason
    assert receipt.attempts == 1
    assert receipt.processed_at is not None
