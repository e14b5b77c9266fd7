"""API tokens: issued once, stored as a SHA-256, compared in constant time, revocable."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.contrib.postgres.expressions import ArraySubquery
from django.db import DEFAULT_DB_ALIAS
from django.db.models import OuterRef
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

from agentplatform.api import access_cache
from agentplatform.api.scoping import workspace_ids_remember
from runs.models import ApiToken, Membership

TOKEN_PREFIX = "agp_"  # noqa: S105 - a public marker, not a secret
# last_used_at is bookkeeping, not an audit log: writing it on every request would turn
# each read into a write, so it is refreshed at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_issue(*, user: User, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for ``user``; the secret is returned here and never again."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name[:100], prefix=secret[: len(TOKEN_PREFIX) + 8], key_hash=_hash(secret)
    )
    return token, secret


def api_token_revoke(*, token: ApiToken) -> bool:
    """Revoke a token; False if it was already revoked. Refused from this process at
    once on commit, from every other when PostgreSQL's notification reaches it."""
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    access_cache.forget_all_on_commit()
    return bool(revoked)


def api_token_resolve(secret: str, *, with_workspaces: bool = False) -> ApiToken | None:
    """The live token whose secret this is, or None.

    The prefix narrows the lookup; the full hash is then compared in constant time so
    response timing says nothing about how much of a guess was right. With
    ``with_workspaces`` the same statement reads the ids of the user's workspaces, which
    ``workspace_ids_for`` then answers from (see ``workspace_ids_remember``).

    A token found is remembered by the hash of its secret (``access_cache``) until a
    token or user changes; a secret that matches nothing is never remembered.
    """
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    digest = _hash(secret)
    key = ("token", digest, with_workspaces)
    prefix = secret[: len(TOKEN_PREFIX) + 8]

    def matching_row() -> TokenRow | None:
        for row in _tokens_live(prefix=prefix, with_workspaces=with_workspaces):
            if hmac.compare_digest(row[0][_KEY_HASH_COLUMN], digest) and row[1][_ACTIVE_COLUMN]:
                return row
        return None

    # Remembered under the hash of this very secret, from a row that matched it.
    row = access_cache.read_through(key, matching_row)
    if row is None:
        return None
    token = _token_from_row(row)
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
        # Remembered with the time just written, or each later request writes it.
        values = list(row[0])
        values[_LAST_USED_COLUMN] = now
        access_cache.replace(key, (tuple(values), row[1], row[2]))
    return token


# A live token as remembered (``access_cache``): its field values, its user's, and the ids
# of the user's workspaces (None when not read). Plain values, so each request builds
# instances of its own from them.
TokenRow = tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...] | None]

_TOKEN_FIELDS = [f.attname for f in ApiToken._meta.concrete_fields]
_USER_FIELDS = [f.attname for f in User._meta.concrete_fields]
_KEY_HASH_COLUMN = _TOKEN_FIELDS.index("key_hash")
_LAST_USED_COLUMN = _TOKEN_FIELDS.index("last_used_at")
_ACTIVE_COLUMN = _USER_FIELDS.index("is_active")


def _tokens_live(*, prefix: str, with_workspaces: bool = False) -> list[TokenRow]:
    """The unrevoked tokens with this prefix, each with its user (and, with
    ``with_workspaces``, the ids of the user's workspaces, read by the same statement)."""
    tokens = ApiToken.objects.select_related("user").filter(prefix=prefix, revoked_at__isnull=True)
    if with_workspaces:
        tokens = tokens.annotate(
            workspace_ids=ArraySubquery(
                Membership.objects.filter(user_id=OuterRef("user_id")).values("workspace_id")
            )
        )
    return [
        (
            tuple(getattr(token, name) for name in _TOKEN_FIELDS),
            tuple(getattr(token.user, name) for name in _USER_FIELDS),
            tuple(token.workspace_ids) if with_workspaces else None,  # type: ignore[attr-defined]
        )
        for token in tokens
    ]


def _token_from_row(row: TokenRow) -> ApiToken:
    """The token of a ``_tokens_live`` row, its user loaded (and the user's workspace ids
    remembered on it, when read)."""
    token = ApiToken.from_db(DEFAULT_DB_ALIAS, _TOKEN_FIELDS, row[0])
    token.user = User.from_db(DEFAULT_DB_ALIAS, _USER_FIELDS, row[1])
    if row[2] is not None:
        workspace_ids_remember(token.user, row[2])
    return token


def bearer_secret(header: str) -> str | None:
    """The secret from an ``Authorization: Bearer <secret>`` (or ``Token``) header."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() not in ("bearer", "token"):
        return None
    return parts[1]


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer agp_...``; answers 401 with a Bearer challenge."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        secret = bearer_secret(header)
        if secret is None:
            if header.split()[0].lower() in ("bearer", "token"):
                raise exceptions.AuthenticationFailed("malformed Authorization header")
            return None
        # A request that changes nothing reads the caller's workspaces with the token:
        # every read is scoped by them, and no membership changes within it.
        token = api_token_resolve(secret, with_workspaces=request.method in SAFE_METHODS)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
