"""factory_boy factories for the domain model."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

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
    model_options = factory.LazyFunction(lambda: {"provider": "scripted",
                                                  "script": demo.fix_script()})
