"""The caller's workspace ids are those of their memberships (with a role if asked),
none for an anonymous caller."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from agentplatform.api.scoping import workspace_ids_for
from runs.models import Membership
from tests.factories import UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


def test_workspace_ids_are_the_callers_memberships() -> None:
    user, other = UserFactory(), UserFactory()
    admin_of, member_of, not_mine = WorkspaceFactory(), WorkspaceFactory(), WorkspaceFactory()
    Membership.objects.create(workspace=admin_of, user=user, role="admin")
    Membership.objects.create(workspace=member_of, user=user, role="member")
    Membership.objects.create(workspace=not_mine, user=other, role="admin")

    ids = workspace_ids_for(user=user)
    assert sorted(ids) == sorted([admin_of.pk, member_of.pk])
    assert workspace_ids_for(user=user, role="admin") == [admin_of.pk]
    assert workspace_ids_for(user=user, role="viewer") == []
    assert workspace_ids_for(user=UserFactory()) == []
    assert workspace_ids_for(user=AnonymousUser()) == []
    assert workspace_ids_for(user=None) == []
