"""Keys API clients wrote into the provider-event namespace before it was reserved are
moved out of it by the migration, so the issue they shadowed is acted on."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from runs.models import Task
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("runs.migrations.0024_reserved_idempotency_keys_released")


def test_client_keys_leave_the_reserved_namespace_and_webhook_keys_stay():
    squatted = TaskFactory(source="api", idempotency_key="github:issue:octo/h2#7")
    shouting = TaskFactory(source="admin", idempotency_key="GitLab:issue:g/p#1")
    real = TaskFactory(source="webhook", idempotency_key="github:issue:octo/h2#8")
    ordinary = TaskFactory(source="api", idempotency_key="deploy-42")

    migration.release(apps, None)

    keys = dict(Task.objects.values_list("pk", "idempotency_key"))
    assert keys[squatted.pk] == "client:github:issue:octo/h2#7"
    assert keys[shouting.pk] == "client:GitLab:issue:g/p#1"
    assert keys[real.pk] == "github:issue:octo/h2#8"
    assert keys[ordinary.pk] == "deploy-42"
