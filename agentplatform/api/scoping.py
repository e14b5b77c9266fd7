"""Which workspaces a caller sees, and in which role.

Every queryset of the API starts here: an object outside the caller's workspaces is
simply not in the queryset, so it answers 404, never 403 and never data.
"""

from __future__ import annotations

from typing import Any

import structlog
from django.contrib.auth.models import User
from django.db.models import QuerySet
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request

from runs.models import Membership, Workspace


def request_user(request: Request) -> User:
    """The authenticated caller of a view behind ``IsAuthenticated``.

    ``request.user`` is typed ``User | AnonymousUser``; the permission check has already
    turned anonymous callers away, so this only narrows the type (and fails closed).
    """
    user = request.user
    if not isinstance(user, User):
        raise NotAuthenticated()
    return user


# Where a user object keeps the ids of its workspaces read with its API token.
_REMEMBERED = "_workspace_ids_read"


def workspace_ids_remember(user: Any, ids: Any) -> None:
    """Keep the ids of ``user``'s workspaces, read with the API token of a request that
    changes nothing (GET, HEAD, OPTIONS), on the user object that request builds: its
    ``workspace_ids_for`` answers from them instead of asking again. No other request
    gets them, so one that adds or removes a membership never reads an answer from
    before; the token's row with them may be remembered between requests
    (``access_cache``), until a membership changes."""
    user.__dict__[_REMEMBERED] = tuple(ids)


def workspace_ids_for(*, user: Any, role: str | None = None) -> list[int]:
    """Ids of the workspaces ``user`` belongs to (with ``role`` if given)."""
    if user is None or not user.is_authenticated:
        return []
    remembered = user.__dict__.get(_REMEMBERED) if role is None else None
    if remembered is not None:
        return list(remembered)
    memberships = Membership.objects.filter(user_id=user.pk)
    if role is not None:
        memberships = memberships.filter(role=role)
    return list(memberships.values_list("workspace_id", flat=True))


def workspaces_visible(*, user: Any) -> QuerySet[Workspace]:
    return Workspace.objects.filter(pk__in=workspace_ids_for(user=user))


def role_in(*, user: Any, workspace_id: int) -> str | None:
    """The caller's role in a workspace, or None when not a member."""
    if user is None or not user.is_authenticated:
        return None
    # The request acts in this workspace: its later log lines say so.
    structlog.contextvars.bind_contextvars(workspace_id=workspace_id)
    return (
        Membership.objects.filter(user=user, workspace_id=workspace_id)
        .values_list("role", flat=True)
        .first()
    )


def is_admin_of(*, user: Any, workspace_id: int) -> bool:
    return role_in(user=user, workspace_id=workspace_id) == Membership.Role.ADMIN
