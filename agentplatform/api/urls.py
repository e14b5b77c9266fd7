"""Routes under /api/."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from agentplatform.api import stream
from agentplatform.api.views import (
    identities,
    inputs,
    operations,
    replay,
    root,
    runs,
    tasks,
    workspaces,
)
from agentplatform.api.views.schema import SchemaApi

urlpatterns = [
    path("", root.ApiRootApi.as_view(), name="api-root"),
    path("tasks/", tasks.TaskCollectionApi.as_view(), name="api-tasks"),
    path("tasks/<uuid:pk>/", tasks.TaskDetailApi.as_view(), name="api-task"),
    path("runs/", runs.RunListApi.as_view(), name="api-runs"),
    path("runs/<uuid:pk>/", runs.RunDetailApi.as_view(), name="api-run"),
    path("runs/<uuid:pk>/events/", runs.RunEventListApi.as_view(), name="api-run-events"),
    path("runs/<uuid:pk>/artifacts/", runs.RunArtifactListApi.as_view(), name="api-run-artifacts"),
    path(
        "runs/<uuid:pk>/artifacts/<uuid:artifact_id>/",
        runs.RunArtifactDetailApi.as_view(),
        name="api-run-artifact",
    ),
    path("runs/<uuid:pk>/cancel/", runs.RunCancelApi.as_view(), name="api-run-cancel"),
    path("runs/<uuid:pk>/approve/", runs.RunApproveApi.as_view(), name="api-run-approve"),
    path("runs/<uuid:pk>/reject/", runs.RunRejectApi.as_view(), name="api-run-reject"),
    path("runs/<uuid:pk>/input/", inputs.RunInputApi.as_view(), name="api-run-input"),
    path("runs/<uuid:pk>/retry/", runs.RunRetryApi.as_view(), name="api-run-retry"),
    path("runs/<uuid:pk>/replay/", replay.RunReplayCreateApi.as_view(), name="api-run-replays"),
    path("runs/<uuid:pk>/fork/", replay.RunForkApi.as_view(), name="api-run-fork"),
    path(
        "runs/<uuid:pk>/replays/<uuid:replay_id>/",
        replay.RunReplayDetailApi.as_view(),
        name="api-run-replay",
    ),
    path("runs/<uuid:pk>/stream", stream.run_stream, name="api-run-stream"),
    path("workspaces/", workspaces.WorkspaceCollectionApi.as_view(), name="api-workspaces"),
    path("workspaces/<slug:slug>/", workspaces.WorkspaceDetailApi.as_view(), name="api-workspace"),
    path(
        "workspaces/<slug:slug>/members/",
        workspaces.WorkspaceMemberCollectionApi.as_view(),
        name="api-workspace-members",
    ),
    path(
        "workspaces/<slug:slug>/members/<str:username>/",
        workspaces.WorkspaceMemberDetailApi.as_view(),
        name="api-workspace-member",
    ),
    path("repositories/", workspaces.RepositoryCollectionApi.as_view(), name="api-repositories"),
    path("repositories/<int:pk>/", workspaces.RepositoryDetailApi.as_view(), name="api-repository"),
    path(
        "repositories/<int:pk>/webhook-secret/",
        identities.RepositoryWebhookSecretApi.as_view(),
        name="api-repository-webhook-secret",
    ),
    path(
        "workspaces/<slug:slug>/identities/",
        identities.IdentityCollectionApi.as_view(),
        name="api-workspace-identities",
    ),
    path(
        "workspaces/<slug:slug>/identities/<int:pk>/",
        identities.IdentityDetailApi.as_view(),
        name="api-workspace-identity",
    ),
    path("tokens/", workspaces.TokenCollectionApi.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/", workspaces.TokenDetailApi.as_view(), name="api-token"),
    path("dead-letters/", operations.DeadLetterListApi.as_view(), name="api-dead-letters"),
    path(
        "dead-letters/<uuid:pk>/", operations.DeadLetterDetailApi.as_view(), name="api-dead-letter"
    ),
    path(
        "dead-letters/<uuid:pk>/requeue/",
        operations.DeadLetterRequeueApi.as_view(),
        name="api-dead-letter-requeue",
    ),
    path(
        "dead-letters/<uuid:pk>/discard/",
        operations.DeadLetterDiscardApi.as_view(),
        name="api-dead-letter-discard",
    ),
    path(
        "webhook-receipts/", operations.WebhookReceiptListApi.as_view(), name="api-webhook-receipts"
    ),
    path(
        "webhook-receipts/<int:pk>/",
        operations.WebhookReceiptDetailApi.as_view(),
        name="api-webhook-receipt",
    ),
    path("outbox/", operations.OutboxStatusApi.as_view(), name="api-outbox"),
    path("schema/", SchemaApi.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path(
        "docs/redoc/",
        SpectacularRedocView.as_view(url_name="api-schema", template_name="api/redoc.html"),
        name="api-redoc",
    ),
]
