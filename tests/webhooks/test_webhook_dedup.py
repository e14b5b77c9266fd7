"""Deduplication: by delivery id at intake, by meaning (comment, review, CI) in processing."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from django.db import connection

from runs.models import PullRequest, Run, Task
from tests.factories import RepositoryFactory, TaskFactory
from tests.webhooks.test_webhook_support import (
    GITHUB_SECRET,
    REPOSITORY_SECRET,
    corpus,
    github_headers,
    github_post,
)
from webhooks.models import WebhookAction, WebhookReceipt
from webhooks.processing import webhook_receipt_process


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def _labelled_issue(full_name: str) -> dict[str, Any]:
    payload = corpus("github", "issues/labeled")
    payload["label"]["name"] = "agent"
    payload["repository"]["full_name"] = full_name
    return payload


def _agent_comment(full_name: str, number: int, body: str, *, on_pr: bool) -> dict[str, Any]:
    payload = corpus("github", "issue_comment/created")
    payload["repository"]["full_name"] = full_name
    payload["issue"]["number"] = number
    if on_pr:
        payload["issue"]["pull_request"] = {"url": "https://example.invalid/pulls/1"}
    payload["comment"]["body"] = body
    return payload


@pytest.mark.django_db
def test_duplicate_delivery_is_answered_200_and_dispatched_once(
    client, django_capture_on_commit_callbacks
):
    payload = corpus("github", "issues/opened")
    with django_capture_on_commit_callbacks() as callbacks:
        first = github_post(client, payload, "issues", delivery="same-guid")
        second = github_post(client, payload, "issues", delivery="same-guid")

    assert first.status_code == 202
    assert second.status_code == 200
    assert second.json() == {"status": "duplicate", "receipt_id": first.json()["receipt_id"]}
    assert WebhookReceipt.objects.count() == 1
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_same_delivery_id_on_two_hooks_is_two_receipts(client):
    payload = corpus("github", "issues/opened")
    assert github_post(client, payload, "issues", delivery="g", hook="1").status_code == 202
    assert github_post(client, payload, "issues", delivery="g", hook="2").status_code == 202
    assert WebhookReceipt.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_deliveries_are_processed_exactly_once(live_server):
    repository = RepositoryFactory(external_id="octo/concurrent", webhook_secret=REPOSITORY_SECRET)
    body = json.dumps(_labelled_issue("octo/concurrent")).encode()
    headers = {
        **github_headers(body, "issues", delivery="race-guid", secret=REPOSITORY_SECRET),
        "Content-Type": "application/json",
    }
    barrier = threading.Barrier(8)
    answers: list[tuple[int, dict[str, Any]]] = []

    def deliver() -> None:
        barrier.wait()
        response = httpx.post(
            f"{live_server.url}/webhooks/github/", content=body, headers=headers, timeout=10
        )
        answers.append((response.status_code, response.json()))

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(status for status, _ in answers) == [200] * 7 + [202]
    assert WebhookReceipt.objects.count() == 1
    receipt = WebhookReceipt.objects.get()
    # Two processing attempts racing each other (a duplicated message): one acts.
    results: list[str] = []

    def process() -> None:
        try:
            results.append(webhook_receipt_process(receipt_id=receipt.pk))
        finally:
            connection.close()

    workers = [threading.Thread(target=process) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(results) == ["processed", "processed"]
    assert Task.objects.filter(repository=repository).count() == 1
    receipt.refresh_from_db()
    assert receipt.attempts == 1


@pytest.mark.django_db
def test_same_comment_under_two_delivery_ids_acts_once(client):
    repository = RepositoryFactory(external_id="octo/dedup", webhook_secret=REPOSITORY_SECRET)
    task = TaskFactory(repository=repository, workspace=repository.workspace)
    PullRequest.objects.create(
        task=task, provider="local", branch="agent/x", base_branch="main", number=5
    )
    payload = _agent_comment("octo/dedup", 5, "/agent please also update the docs", on_pr=True)

    ids = [
        github_post(client, payload, "issue_comment", delivery=d, secret=REPOSITORY_SECRET).json()[
            "receipt_id"
        ]
        for d in ("first-guid", "second-guid")
    ]
    statuses = [webhook_receipt_process(receipt_id=i) for i in ids]

    assert statuses == ["processed", "ignored"]
    assert WebhookReceipt.objects.get(pk=ids[1]).status_reason == "comment already acted on"
    assert Run.objects.filter(task=task).count() == 1
    assert Run.objects.get(task=task).feedback == "please also update the docs"
    assert WebhookAction.objects.count() == 1


@pytest.mark.django_db
def test_same_labelled_issue_twice_is_one_task(client):
    repository = RepositoryFactory(external_id="octo/once", webhook_secret=REPOSITORY_SECRET)
    payload = _labelled_issue("octo/once")
    for delivery in ("a", "b"):
        receipt_id = github_post(
            client, payload, "issues", delivery=delivery, secret=REPOSITORY_SECRET
        ).json()["receipt_id"]
        webhook_receipt_process(receipt_id=receipt_id)
    assert Task.objects.filter(repository=repository).count() == 1


@pytest.mark.django_db
def test_same_ci_failure_under_two_delivery_ids_starts_one_followup(client):
    repository = RepositoryFactory(
        external_id="Codertocat/Hello-World", webhook_secret=REPOSITORY_SECRET
    )
    task = TaskFactory(repository=repository, workspace=repository.workspace)
    payload = corpus("github", "check_run/completed.1")
    PullRequest.objects.create(
        task=task,
        provider="local",
        branch="changes",
        base_branch="main",
        number=2,
        head_sha=payload["check_run"]["head_sha"],
    )
    for delivery in ("ci-1", "ci-2"):
        receipt_id = github_post(
            client, payload, "check_run", delivery=delivery, secret=REPOSITORY_SECRET
        ).json()["receipt_id"]
        webhook_receipt_process(receipt_id=receipt_id)
    assert Run.objects.filter(task=task).count() == 1
    assert "failure" in Run.objects.get(task=task).feedback
