"""factory_boy factories for the domain model."""

from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from runs import demo
from runs.models import Repository, Task, Workspace


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.com")


class WorkspaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workspace

    slug = factory.Sequence(lambda n: f"ws{n}")
    name = factory.LazyAttribute(lambda o: o.slug.upper())


class RepositoryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Repository

    workspace = factory.SubFactory(WorkspaceFactory)
    name = factory.Sequence(lambda n: f"repo{n}")
    clone_url = "/nonexistent"
    default_branch = "main"
    test_command = factory.LazyFunction(demo.test_command)
    allowed_commands = factory.LazyFunction(demo.allowed_commands)


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    workspace = factory.SubFactory(WorkspaceFactory)
    repository = factory.SubFactory(
        RepositoryFactory, workspace=factory.SelfAttribute("..workspace")
    )
    instruction = "Fix add()"
    model_options = factory.LazyFunction(
        lambda: {"provider": "scripted", "script": demo.fix_script()}
    )


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "runs.Run"

    task = factory.SubFactory(TaskFactory)
    run_no = factory.Sequence(lambda n: n + 1)


class DeadLetterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "jobs.DeadLetter"

    task_name = "jobs.outbox_relay"
    task_id = factory.Faker("uuid4")
    exception = "ConnectionError: broker went away"
    traceback = "Traceback (most recent call last):\n  ...\nConnectionError: broker went away"
    attempts = 5
    first_failed_at = factory.LazyFunction(timezone.now)
    last_failed_at = factory.LazyFunction(timezone.now)


class OutboxEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "jobs.OutboxEvent"

    type = "agent.run.queued"
    partition_key = factory.Faker("uuid4")
    payload = factory.LazyAttribute(lambda o: {"specversion": "1.0", "type": o.type})


class WebhookReceiptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "webhooks.WebhookReceipt"

    provider = "github"
    delivery_id = factory.Faker("uuid4")
    event = "issues"
    action = "labeled"
    headers = factory.LazyFunction(
        lambda: {"X-GitHub-Event": "issues", "X-Hub-Signature-256": "sha256=abc"}
    )
    payload = factory.LazyFunction(lambda: {"action": "labeled", "issue": {"number": 1}})


def member_with_repository(role: str = "member") -> tuple[Any, Workspace, Repository]:
    """A user who is a member of a new workspace that has one repository."""
    from runs.models import Membership

    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=role)
    return user, workspace, RepositoryFactory(workspace=workspace)


def api_client_for(user: Any) -> Any:
    """A DRF test client signed in as ``user``."""
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user)
    return api
