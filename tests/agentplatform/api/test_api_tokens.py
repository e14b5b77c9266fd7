"""API tokens: issued once by the command or the API, stored hashed, revocable."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from runs.models import ApiToken, Membership
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_issue_token_creates_user_and_membership_and_prints_the_token_last(workspace):
    out = StringIO()
    call_command("issue_token", "--user", "ci-bot", "--workspace", workspace.slug, stdout=out)

    secret = out.getvalue().strip().splitlines()[-1]
    membership = Membership.objects.get(user__username="ci-bot", workspace=workspace)
    assert membership.role == Membership.Role.MEMBER
    token = ApiToken.objects.get(user__username="ci-bot")
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {token.prefix, token.key_hash, token.name}
    response = _bearer(secret).get("/api/workspaces/")
    assert response.status_code == 200
    assert [w["slug"] for w in response.json()] == [workspace.slug]


def test_issue_token_for_an_existing_member_keeps_their_role(workspace):
    user = UserFactory(username="ops")
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.ADMIN)
    call_command("issue_token", "--user", "ops", "--workspace", workspace.slug, stdout=StringIO())

    assert Membership.objects.get(user=user).role == Membership.Role.ADMIN
    assert ApiToken.objects.filter(user=user).count() == 1


def test_token_created_over_the_api_is_shown_once_and_revocable():
    user = UserFactory()
    session = APIClient()
    session.force_authenticate(user)

    created = session.post("/api/tokens/", {"name": "laptop"}, format="json")
    secret = created.json()["token"]
    listed = session.get("/api/tokens/").json()
    works = _bearer(secret).get("/api/tokens/")
    revoked = session.delete(f"/api/tokens/{created.json()['id']}/")
    after = _bearer(secret).get("/api/tokens/")

    assert created.status_code == 201
    assert "token" not in listed[0]
    assert works.status_code == 200
    assert revoked.status_code == 204
    assert after.status_code == 401
    assert after["Content-Type"] == "application/problem+json"
    assert after["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", ["Bearer agp_wrong", "Bearer", "Token x y"])
def test_bad_credentials_are_401_problems(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/tasks/")

    assert response.status_code == 401
    assert response.json()["code"] in ("authentication_failed", "not_authenticated")


def test_another_users_token_cannot_be_revoked():
    owner_token = ApiToken.objects.create(user=UserFactory(), prefix="agp_x", key_hash="0" * 64)
    client = APIClient()
    client.force_authenticate(UserFactory())

    assert client.delete(f"/api/tokens/{owner_token.pk}/").status_code == 404
    owner_token.refresh_from_db()
    assert owner_token.revoked_at is None
