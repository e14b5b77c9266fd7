"""Who is who across the platform and the git providers.

- Provider identities: the platform user a provider account speaks for in a workspace.
- The reserved idempotency namespace: keys the platform derives from provider events
  (``github:issue:octo/h2#7``); API and console clients may not write them, or a task
  submitted with one would make the real issue be ignored later.
- Repository webhook secrets: made here, shown once, never logged.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlparse

from django.conf import settings

from runs.models import Membership, ProviderIdentity, Task

# Every key the webhooks derive starts with its provider's name and a colon.
RESERVED_KEY_PREFIXES = ("github:", "gitlab:")


def idempotency_key_reserved(key: str | None) -> bool:
    """Whether ``key`` is in the namespace of keys derived from provider events."""
    return bool(key) and str(key).strip().lower().startswith(RESERVED_KEY_PREFIXES)


def provider_host(provider: str) -> str:
    """The web host of the provider this installation talks to (from its API URL)."""
    api_url = settings.GITHUB_API_URL if provider == "github" else settings.GITLAB_API_URL
    host = (urlparse(api_url).hostname or "").lower()
    # github.com's API lives on its own host; an Enterprise server's under /api/v3.
    return "github.com" if host == "api.github.com" else host


def identity_user(*, workspace_id: int, provider: str, external_user_id: Any) -> Any:
    """The active member of the workspace that this provider account is linked to."""
    if external_user_id in (None, ""):
        return None
    identity = (
        ProviderIdentity.objects.filter(
            workspace_id=workspace_id,
            provider=provider,
            host=provider_host(provider),
            external_user_id=str(external_user_id),
        )
        .select_related("user")
        .first()
    )
    if identity is None or not identity.user.is_active:
        return None
    # A linked user who left the workspace no longer speaks for it.
    member = Membership.objects.filter(workspace_id=workspace_id, user=identity.user).exists()
    return identity.user if member or identity.user.is_superuser else None


def requester_names(*, user: Any, workspace_id: int) -> set[str]:
    """The names a task's ``requested_by`` may carry for ``user``: their username, and
    ``provider:login`` of each account linked to them in the workspace (a task from a
    labelled issue is requested by the provider account that labelled it)."""
    names = {user.get_username()}
    for provider, login in ProviderIdentity.objects.filter(
        workspace_id=workspace_id, user=user
    ).values_list("provider", "login"):
        if login:
            names.add(f"{provider}:{login}")
    return names


def requested_by_user(*, task: Task, user: Any) -> bool:
    # Provider logins are case-insensitive; erring towards "the requester" only refuses.
    names = {name.lower() for name in requester_names(user=user, workspace_id=task.workspace_id)}
    return bool(task.requested_by) and task.requested_by.lower() in names


def webhook_secret_new() -> str:
    return secrets.token_urlsafe(32)
