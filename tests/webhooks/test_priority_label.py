"""An issue's ``agent:priority:<class>`` label sets its task's priority; without one the
repository's default applies."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Task
from tests.factories import RepositoryFactory
from tests.webhooks.test_webhook_support import (
    GITHUB_SECRET,
    REPOSITORY_SECRET,
    corpus,
    github_post,
)
from webhooks.processing import webhook_receipt_process

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def secrets(settings: Any) -> None:
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET


def _deliver(client: Any, full_name: str, labels: list[str], delivery: str) -> None:
    payload = corpus("github", "issues/labeled")
    payload["label"]["name"] = "agent"
    payload["repository"]["full_name"] = full_name
    payload["issue"]["labels"] = [{"name": name} for name in ["agent", *labels]]
    receipt = github_post(client, payload, "issues", delivery=delivery, secret=REPOSITORY_SECRET)
    webhook_receipt_process(receipt_id=receipt.json()["receipt_id"])


def test_label_sets_the_class_and_the_repository_default_applies_otherwise(client: Any) -> None:
    labelled = RepositoryFactory(external_id="octo/labelled", webhook_secret=REPOSITORY_SECRET)
    plain = RepositoryFactory(
        external_id="octo/plain", webhook_secret=REPOSITORY_SECRET, default_priority=200
    )
    _deliver(client, "octo/labelled", ["bug", "agent:priority:security"], "d1")
    _deliver(client, "octo/plain", ["bug"], "d2")
    assert Task.objects.get(repository=labelled).priority == 10
    assert Task.objects.get(repository=plain).priority == 200
