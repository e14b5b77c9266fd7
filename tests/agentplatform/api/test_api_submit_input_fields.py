"""The submission's input serializer makes its fields once per thread: every instance
validates as a fresh one would (no errors or values left from the one before), and a
field's context is always its own instance's, in this thread and in others."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from agentplatform.api.views.tasks import TaskCollectionApi
from runs.models import Membership
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)

Input = TaskCollectionApi.CreateInputSerializer


def _member() -> tuple[object, object]:
    workspace = WorkspaceFactory()
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    return user, RepositoryFactory(workspace=workspace)


def _validate(user: object, data: dict) -> tuple[bool, dict, dict]:
    serializer = Input(data=data, context={"request": SimpleNamespace(user=user)})
    ok = serializer.is_valid()
    return ok, dict(serializer.validated_data) if ok else {}, dict(serializer.errors)


def test_each_instance_validates_as_a_fresh_one(monkeypatch) -> None:
    user, repository = _member()
    bodies = [
        {"repository": repository.pk, "instruction": "Fix it", "budget": {"model_turns": 2}},
        {"repository": repository.pk, "instruction": "", "priority": 500, "budget": {"x": 1}},
        {"repository": repository.pk, "instruction": "Again"},
        {"repository": "1", "instruction": "Typed", "executionMode": "dry_run"},
        {"repository": repository.pk, "instruction": "Last", "risk_level": "high"},
    ]
    cached = [_validate(user, body) for body in bodies]
    # The fields as DRF makes them for every instance: deep copies of the declared ones.
    monkeypatch.setattr(Input, "fields", Input.__mro__[2].fields)
    fresh = [_validate(user, body) for body in bodies]
    assert cached == fresh
    assert [ok for ok, _, _ in cached] == [True, False, True, False, True]


def test_a_fields_context_is_its_own_instances_in_every_thread() -> None:
    (ann, ann_repository), (bob, bob_repository) = _member(), _member()
    barrier = threading.Barrier(2)
    seen: dict[str, tuple[bool, bool]] = {}

    def submit(name: str, user: object, mine: object, theirs: object) -> None:
        try:
            barrier.wait(timeout=10)
            own = _validate(user, {"repository": mine.pk, "instruction": "x"})[0]
            barrier.wait(timeout=10)
            other = _validate(user, {"repository": theirs.pk, "instruction": "x"})[0]
            seen[name] = (own, other)
        finally:
            from django.db import connection

            connection.close()

    threads = [
        threading.Thread(target=submit, args=("ann", ann, ann_repository, bob_repository)),
        threading.Thread(target=submit, args=("bob", bob, bob_repository, ann_repository)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen == {"ann": (True, False), "bob": (True, False)}

    first = Input(data={}, context={"request": SimpleNamespace(user=ann)})
    first_fields = first.fields
    second = Input(data={}, context={"request": SimpleNamespace(user=bob)})
    assert second.fields["repository"].context["request"].user is bob
    assert second.fields["budget"].fields["model_turns"].root is second
    assert first_fields["repository"] is second.fields["repository"]  # made once per thread
