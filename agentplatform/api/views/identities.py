"""What proves who: a repository's webhook secret, a member's linked provider accounts.

A repository's webhook secret is the proof that a delivery belongs to it (docs/design.md §9);
it is never shown again after the rotation that made it. A linked provider account is
what lets a comment decide an approval as a platform user; each workspace keeps its own
links, so a workspace's admin can link its members without giving anyone their power in
another workspace.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api.errors import ProblemError
from agentplatform.api.scoping import is_admin_of, request_user, workspace_ids_for
from agentplatform.api.strict import StrictInput
from runs.identities import provider_host, webhook_secret_new
from runs.logs import log
from runs.models import Membership, ProviderIdentity, Repository, Workspace


def webhook_path(repository: Repository) -> str | None:
    """The repository's own webhook URL path; local repositories have none."""
    if repository.provider not in (Repository.Provider.GITHUB, Repository.Provider.GITLAB):
        return None
    return f"/webhooks/{repository.provider}/{repository.pk}/"


def webhook_url(repository: Repository, request: Request | None) -> str | None:
    path = webhook_path(repository)
    if path is None or request is None:
        return path
    return request.build_absolute_uri(path)


class WebhookSecretOutputSerializer(serializers.Serializer):
    webhook_url = serializers.CharField(
        help_text="Configure the provider's webhook with this URL and the secret below."
    )
    webhook_secret = serializers.CharField(
        help_text="The new secret (GitHub: the webhook's secret; GitLab: its token). Shown "
        "only in this response; the previous one stops working at once."
    )


class RepositoryWebhookSecretApi(APIView):
    """Workspace admins make a new webhook secret for a repository (POST); shown once."""

    @extend_schema(
        operation_id="repositories_webhook_secret_rotate",
        request=None,
        responses={201: WebhookSecretOutputSerializer},
    )
    def post(self, request: Request, pk: int) -> Response:
        repository = get_object_or_404(
            Repository.objects.filter(workspace_id__in=workspace_ids_for(user=request.user)),
            pk=pk,
        )
        if not is_admin_of(user=request.user, workspace_id=repository.workspace_id):
            raise PermissionDenied("only workspace admins may do this")
        if webhook_path(repository) is None:
            raise ProblemError(
                status_code=409,
                code="no_webhooks",
                detail="a local repository receives no webhooks",
            )
        secret = webhook_secret_new()
        Repository.objects.filter(pk=repository.pk).update(webhook_secret=secret)
        log.info(
            "repository.webhook_secret_rotated",
            repository_id=repository.pk,
            by=request.user.get_username(),
        )
        body = {"webhook_url": webhook_url(repository, request), "webhook_secret": secret}
        return Response(WebhookSecretOutputSerializer(body).data, status=201)


# --- provider identities -----------------------------------------------------------------------


class IdentityOutputSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ProviderIdentity
        fields = [
            "id",
            "username",
            "provider",
            "host",
            "external_user_id",
            "login",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


def _workspace(request: Request, slug: str) -> Workspace:
    return get_object_or_404(
        Workspace.objects.filter(pk__in=workspace_ids_for(user=request.user)), slug=slug
    )


def _identities(workspace: Workspace) -> QuerySet[ProviderIdentity]:
    return (
        ProviderIdentity.objects.filter(workspace=workspace)
        .select_related("user")
        .order_by("user__username", "provider", "id")
    )


class IdentityCollectionApi(APIView):
    """The workspace's linked provider accounts (GET); a member links their own, an
    admin any member's (POST)."""

    class InputSerializer(StrictInput):
        provider = serializers.ChoiceField(choices=ProviderIdentity.Provider.choices)
        external_user_id = serializers.RegexField(
            r"^[0-9]{1,20}$",
            help_text="The account's numeric id (GitHub: GET /users/<login> → id; GitLab: "
            "the user's ID); logins can be renamed and re-registered, ids cannot.",
        )
        login = serializers.CharField(max_length=200, required=False, default="")
        username = serializers.CharField(
            max_length=150, required=False, help_text="The member to link; default: you."
        )

    @extend_schema(
        operation_id="workspaces_identities_list", responses=IdentityOutputSerializer(many=True)
    )
    def get(self, request: Request, slug: str) -> Response:
        workspace = _workspace(request, slug)
        return Response(IdentityOutputSerializer(_identities(workspace), many=True).data)

    @extend_schema(
        operation_id="workspaces_identities_create",
        request=InputSerializer,
        responses={201: IdentityOutputSerializer},
    )
    def post(self, request: Request, slug: str) -> Response:
        workspace = _workspace(request, slug)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        caller = request_user(request)
        username = data.get("username") or caller.get_username()
        if username != caller.get_username() and not is_admin_of(
            user=caller, workspace_id=workspace.pk
        ):
            raise PermissionDenied("only workspace admins link another member's account")
        membership = (
            Membership.objects.filter(workspace=workspace, user__username=username)
            .select_related("user")
            .first()
        )
        if membership is None:
            raise serializers.ValidationError(
                {"username": ["not a member of this workspace"]}, code="does_not_exist"
            )
        try:
            with transaction.atomic():
                identity = ProviderIdentity.objects.create(
                    workspace=workspace,
                    user=membership.user,
                    provider=data["provider"],
                    host=provider_host(data["provider"]),
                    external_user_id=data["external_user_id"],
                    login=data["login"],
                    created_by=caller.get_username(),
                )
        except IntegrityError as exc:
            raise ProblemError(
                status_code=409,
                code="identity_taken",
                detail="this provider account is already linked in this workspace",
            ) from exc
        return Response(IdentityOutputSerializer(identity).data, status=201)


class IdentityDetailApi(APIView):
    """Unlink an account (DELETE): its owner or a workspace admin."""

    @extend_schema(operation_id="workspaces_identities_destroy", responses={204: None})
    def delete(self, request: Request, slug: str, pk: int) -> Response:
        workspace = _workspace(request, slug)
        identity = get_object_or_404(_identities(workspace), pk=pk)
        caller: Any = request_user(request)
        if identity.user_id != caller.pk and not is_admin_of(
            user=caller, workspace_id=workspace.pk
        ):
            raise PermissionDenied("only the account's owner or a workspace admin may unlink it")
        identity.delete()
        return Response(status=204)
