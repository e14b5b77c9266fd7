"""Workspaces, their members and repositories (managed by workspace admins), API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api.auth import api_token_issue, api_token_revoke
from agentplatform.api.filters import RepositoryFilter, StrictFilterBackend
from agentplatform.api.pagination import LimitOffsetPagination
from agentplatform.api.scoping import is_admin_of, request_user, workspace_ids_for
from agentplatform.api.strict import StrictInput, StrictModelInput
from agentplatform.api.views.identities import webhook_url
from runs.models import ApiToken, Membership, Repository, Workspace
from runs.repositories import CloneUrlRefused, clone_url_check


def _admin_required(request: Request, workspace_id: int) -> None:
    if not is_admin_of(user=request.user, workspace_id=workspace_id):
        raise PermissionDenied("only workspace admins may do this")


# --- workspaces --------------------------------------------------------------------------------


class WorkspaceOutputSerializer(serializers.ModelSerializer):
    role = serializers.CharField(
        read_only=True, allow_null=True, help_text="The caller's role in the workspace."
    )

    class Meta:
        model = Workspace
        fields = [
            "slug",
            "name",
            "max_active_runs",
            "daily_cost_budget_usd",
            "approval_by",
            "approval_self_high_risk",
            "role",
            "created_at",
        ]
        read_only_fields = fields


def _with_role(workspace: Workspace, role: str | None) -> Workspace:
    """Attach the caller's role, which WorkspaceOutputSerializer reads as ``role``."""
    # Not a model field: a plain instance attribute, set the way ``obj.role = ...`` would.
    workspace.__dict__["role"] = role
    return workspace


def _workspaces_visible(request: Request) -> QuerySet[Workspace]:
    ids = workspace_ids_for(user=request.user)
    roles = dict(
        Membership.objects.filter(user=request_user(request)).values_list("workspace_id", "role")
    )
    workspaces = Workspace.objects.filter(pk__in=ids).order_by("slug")
    for workspace in workspaces:
        _with_role(workspace, roles.get(workspace.pk))
    return workspaces


class WorkspaceCollectionApi(APIView):
    """The caller's workspaces (GET); staff create new ones (POST) and become admin."""

    class CreateInputSerializer(StrictModelInput):
        class Meta:
            model = Workspace
            fields = ["slug", "name", "max_active_runs", "daily_cost_budget_usd"]
            # 0 would hold every task of the workspace back forever.
            extra_kwargs = {"max_active_runs": {"min_value": 1}}

    @extend_schema(operation_id="workspaces_list", responses=WorkspaceOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(WorkspaceOutputSerializer(_workspaces_visible(request), many=True).data)

    @extend_schema(
        operation_id="workspaces_create",
        request=CreateInputSerializer,
        responses={201: WorkspaceOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        if not request.user.is_staff:
            raise PermissionDenied("only staff create workspaces")
        serializer = self.CreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            workspace = serializer.save()
            Membership.objects.create(
                workspace=workspace, user=request.user, role=Membership.Role.ADMIN
            )
        _with_role(workspace, Membership.Role.ADMIN)
        return Response(WorkspaceOutputSerializer(workspace).data, status=201)


class WorkspaceDetailApi(APIView):
    """One workspace (GET, members); its admins change its name and limits (PATCH)."""

    class UpdateInputSerializer(StrictModelInput):
        class Meta:
            model = Workspace
            fields = [
                "name",
                "max_active_runs",
                "daily_cost_budget_usd",
                "approval_by",
                "approval_self_high_risk",
            ]
            extra_kwargs = {"max_active_runs": {"min_value": 1}}

    def _get(self, request: Request, slug: str) -> Workspace:
        return get_object_or_404(_workspaces_visible(request), slug=slug)

    @extend_schema(operation_id="workspaces_retrieve", responses=WorkspaceOutputSerializer)
    def get(self, request: Request, slug: str) -> Response:
        workspace = self._get(request, slug)
        _with_role(
            workspace, Membership.objects.get(user=request_user(request), workspace=workspace).role
        )
        return Response(WorkspaceOutputSerializer(workspace).data)

    @extend_schema(
        operation_id="workspaces_partial_update",
        request=UpdateInputSerializer,
        responses=WorkspaceOutputSerializer,
    )
    def patch(self, request: Request, slug: str) -> Response:
        workspace = self._get(request, slug)
        _admin_required(request, workspace.pk)
        serializer = self.UpdateInputSerializer(workspace, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        workspace = serializer.save()
        _with_role(workspace, Membership.Role.ADMIN)
        return Response(WorkspaceOutputSerializer(workspace).data)


class MembershipOutputSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = fields


class WorkspaceMemberCollectionApi(APIView):
    """Members of a workspace (GET); admins add or change a member's role (POST)."""

    class InputSerializer(StrictInput):
        username = serializers.CharField(max_length=150)
        role = serializers.ChoiceField(
            choices=Membership.Role.choices, default=Membership.Role.MEMBER
        )

    @extend_schema(
        operation_id="workspaces_members_list", responses=MembershipOutputSerializer(many=True)
    )
    def get(self, request: Request, slug: str) -> Response:
        workspace = get_object_or_404(_workspaces_visible(request), slug=slug)
        members = (
            Membership.objects.filter(workspace=workspace)
            .select_related("user")
            .order_by("user__username")
        )
        return Response(MembershipOutputSerializer(members, many=True).data)

    @extend_schema(
        operation_id="workspaces_members_set",
        request=InputSerializer,
        responses={200: MembershipOutputSerializer},
    )
    def post(self, request: Request, slug: str) -> Response:
        workspace = get_object_or_404(_workspaces_visible(request), slug=slug)
        _admin_required(request, workspace.pk)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = (
            get_user_model()
            .objects.filter(username=serializer.validated_data["username"], is_active=True)
            .first()
        )
        if user is None:
            raise serializers.ValidationError(
                {"username": ["no such active user"]}, code="does_not_exist"
            )
        membership, _ = Membership.objects.update_or_create(
            workspace=workspace,
            user=user,
            defaults={"role": serializer.validated_data["role"]},
        )
        return Response(MembershipOutputSerializer(membership).data)


class WorkspaceMemberDetailApi(APIView):
    """Admins remove a member (DELETE)."""

    @extend_schema(operation_id="workspaces_members_destroy", responses={204: None})
    def delete(self, request: Request, slug: str, username: str) -> Response:
        workspace = get_object_or_404(_workspaces_visible(request), slug=slug)
        _admin_required(request, workspace.pk)
        membership = get_object_or_404(Membership, workspace=workspace, user__username=username)
        membership.delete()
        return Response(status=204)


# --- repositories ------------------------------------------------------------------------------


class RepositoryOutputSerializer(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    has_webhook_secret = serializers.SerializerMethodField()
    webhook_url = serializers.SerializerMethodField(
        help_text="Where the provider must send this repository's deliveries, signed with "
        "its webhook secret (null for local repositories)."
    )

    class Meta:
        model = Repository
        fields = [
            "id",
            "workspace",
            "name",
            "provider",
            "external_id",
            "clone_url",
            "default_branch",
            "test_command",
            "forbidden_paths",
            "allowed_commands",
            "max_active_runs",
            "plan_review",
            "has_webhook_secret",
            "webhook_url",
            "created_at",
        ]
        read_only_fields = fields

    def get_has_webhook_secret(self, repository: Repository) -> bool:
        return bool(repository.webhook_secret)

    def get_webhook_url(self, repository: Repository) -> str | None:
        return webhook_url(repository, self.context.get("request"))


class RepositoryWriteSerializer(StrictModelInput):
    webhook_secret = serializers.CharField(
        max_length=200, required=False, allow_blank=True, write_only=True
    )
    forbidden_paths = serializers.ListField(
        child=serializers.CharField(max_length=300), required=False
    )
    allowed_commands = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False
    )

    class Meta:
        model = Repository
        fields = [
            "name",
            "provider",
            "external_id",
            "clone_url",
            "default_branch",
            "test_command",
            "webhook_secret",
            "forbidden_paths",
            "allowed_commands",
            "max_active_runs",
            "plan_review",
        ]
        extra_kwargs = {"max_active_runs": {"min_value": 1}}


def _local_clone_guard(request: Request, provider: str, clone_url: str | None) -> None:
    # Whatever the provider: a clone URL that is a path on the platform's own disk would
    # let a workspace admin read another tenant's repository (runs/repositories.py).
    if clone_url is None:
        return
    try:
        clone_url_check(clone_url, staff=bool(request.user.is_staff))
    except CloneUrlRefused as exc:
        raise serializers.ValidationError({"clone_url": [str(exc)]}) from exc


def _repositories_visible(request: Request) -> QuerySet[Repository]:
    return (
        Repository.objects.filter(workspace_id__in=workspace_ids_for(user=request.user))
        .select_related("workspace")
        .order_by("workspace__slug", "name", "id")
    )


class RepositoryCollectionApi(generics.ListAPIView):
    """Repositories of the caller's workspaces (GET); workspace admins add one (POST)."""

    class CreateInputSerializer(RepositoryWriteSerializer):
        workspace = serializers.SlugField(max_length=64)

        class Meta(RepositoryWriteSerializer.Meta):
            fields = ["workspace", *RepositoryWriteSerializer.Meta.fields]

    serializer_class = RepositoryOutputSerializer
    pagination_class = LimitOffsetPagination
    filter_backends = [StrictFilterBackend]
    filterset_class = RepositoryFilter

    def get_queryset(self) -> QuerySet[Repository]:
        return _repositories_visible(self.request)

    @extend_schema(
        operation_id="repositories_create",
        request=CreateInputSerializer,
        responses={201: RepositoryOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = self.CreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        workspace = Workspace.objects.filter(
            slug=data.pop("workspace"), pk__in=workspace_ids_for(user=request.user)
        ).first()
        if workspace is None:
            raise serializers.ValidationError(
                {"workspace": ["no such workspace"]}, code="does_not_exist"
            )
        _admin_required(request, workspace.pk)
        _local_clone_guard(
            request, data.get("provider", Repository.Provider.LOCAL), data.get("clone_url")
        )
        if Repository.objects.filter(workspace=workspace, name=data["name"]).exists():
            raise serializers.ValidationError({"name": ["already used in this workspace"]})
        repository = Repository.objects.create(workspace=workspace, **data)
        return Response(
            RepositoryOutputSerializer(repository, context={"request": request}).data, status=201
        )


class RepositoryDetailApi(APIView):
    """One repository (GET); workspace admins change (PATCH) or delete it (DELETE)."""

    class UpdateInputSerializer(RepositoryWriteSerializer):
        pass

    def _get(self, request: Request, pk: Any) -> Repository:
        return get_object_or_404(_repositories_visible(request), pk=pk)

    @extend_schema(operation_id="repositories_retrieve", responses=RepositoryOutputSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(
            RepositoryOutputSerializer(self._get(request, pk), context={"request": request}).data
        )

    @extend_schema(
        operation_id="repositories_partial_update",
        request=UpdateInputSerializer,
        responses=RepositoryOutputSerializer,
    )
    def patch(self, request: Request, pk: int) -> Response:
        repository = self._get(request, pk)
        _admin_required(request, repository.workspace_id)
        serializer = self.UpdateInputSerializer(repository, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        _local_clone_guard(
            request,
            serializer.validated_data.get("provider", repository.provider),
            serializer.validated_data.get("clone_url"),
        )
        name = serializer.validated_data.get("name")
        if (
            name
            and Repository.objects.filter(workspace_id=repository.workspace_id, name=name)
            .exclude(pk=repository.pk)
            .exists()
        ):
            raise serializers.ValidationError({"name": ["already used in this workspace"]})
        repository = serializer.save()
        return Response(RepositoryOutputSerializer(repository, context={"request": request}).data)

    @extend_schema(operation_id="repositories_destroy", responses={204: None, 409: None})
    def delete(self, request: Request, pk: int) -> Response:
        repository = self._get(request, pk)
        _admin_required(request, repository.workspace_id)
        repository.delete()  # ProtectedError (it has tasks) answers 409
        return Response(status=204)


# --- tokens ------------------------------------------------------------------------------------


class TokenOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class TokenCollectionApi(APIView):
    """The caller's API tokens (GET); issue a new one (POST) — its secret is shown once."""

    class CreateInputSerializer(StrictInput):
        name = serializers.CharField(max_length=100, default="", allow_blank=True)

    class CreateOutputSerializer(TokenOutputSerializer):
        token = serializers.CharField(
            read_only=True, help_text="The secret; shown only in this response."
        )

        class Meta(TokenOutputSerializer.Meta):
            fields = [*TokenOutputSerializer.Meta.fields, "token"]
            read_only_fields = fields

    @extend_schema(operation_id="tokens_list", responses=TokenOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        tokens = ApiToken.objects.filter(user=request_user(request)).order_by("-created_at")
        return Response(TokenOutputSerializer(tokens, many=True).data)

    @extend_schema(
        operation_id="tokens_create",
        request=CreateInputSerializer,
        responses={201: CreateOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = self.CreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, secret = api_token_issue(
            user=request_user(request), name=serializer.validated_data["name"]
        )
        # CreateOutputSerializer reads the secret as ``token``; it is not a model field.
        token.__dict__["token"] = secret
        return Response(self.CreateOutputSerializer(token).data, status=201)


class TokenDetailApi(APIView):
    """Revoke one of the caller's tokens (DELETE); it stops working at once."""

    @extend_schema(operation_id="tokens_revoke", responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        token = get_object_or_404(ApiToken, user=request.user, pk=pk)
        api_token_revoke(token=token)
        return Response(status=204)
