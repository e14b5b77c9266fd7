"""Every console list, filter and detail page loads."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.urls import reverse

from runs.models import Run
from tests.factories import (
    DeadLetterFactory,
    OutboxEventFactory,
    RunFactory,
    TaskFactory,
    UserFactory,
    WebhookReceiptFactory,
)
from tests.runs.test_admin_run_page import run_history_create


@pytest.fixture
def su_client(client: Any, db: Any) -> Any:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def populated(db: Any) -> dict[str, Any]:
    run = run_history_create(pr=True)
    failed = RunFactory(
        task=TaskFactory(workspace=run.task.workspace),
        status=Run.Status.FAILED,
        failure_reason="budget_cost",
    )
    _delivery_rows(run)
    return {
        "run": run,
        "failed": failed,
        "letter": DeadLetterFactory(),
        "event": OutboxEventFactory(),
        "receipt": WebhookReceiptFactory(),
    }


def _delivery_rows(run: Run) -> None:
    """One row in each delivery table that exists in this build."""
    import uuid

    from django.apps import apps
    from django.utils import timezone

    workspace = run.task.workspace
    rows = {
        ("jobs", "EventSubscription"): {
            "workspace_id": workspace.pk,
            "url": "http://127.0.0.1:9/h",
            "secret": "s3cret",
        },
        ("jobs", "WorkspaceDailyCost"): {
            "workspace_id": workspace.pk,
            "day": timezone.now().date(),
        },
        ("runs", "WorkspaceSpend"): {
            "workspace": workspace,
            "day": timezone.now().date(),
            "updated_at": timezone.now(),
        },
        ("jobs", "Notification"): {"event_id": uuid.uuid4(), "channel": "github_comment"},
        ("webhooks", "WebhookAction"): {"provider": "github", "key": "comment:1"},
    }
    for (app, name), fields in rows.items():
        try:
            model = apps.get_model(app, name)
        except LookupError:
            continue
        model.objects.create(**fields)


def _model_admins() -> list[tuple[Any, Any]]:
    return list(admin.site._registry.items())


def test_every_changelist_and_add_page_loads(su_client: Any, populated: dict[str, Any]) -> None:
    for model, model_admin in _model_admins():
        info = f"{model._meta.app_label}_{model._meta.model_name}"
        response = su_client.get(reverse(f"admin:{info}_changelist"))
        assert response.status_code == 200, info
        if model_admin.has_add_permission(response.wsgi_request):
            assert su_client.get(reverse(f"admin:{info}_add")).status_code == 200, info


def test_every_change_page_loads(su_client: Any, populated: dict[str, Any]) -> None:
    for model, _ in _model_admins():
        info = f"{model._meta.app_label}_{model._meta.model_name}"
        for obj in model._default_manager.all()[:3]:
            url = reverse(f"admin:{info}_change", args=[obj.pk])
            assert su_client.get(url).status_code == 200, (info, obj.pk)


def test_every_filter_choice_loads(su_client: Any, populated: dict[str, Any]) -> None:
    for model, _ in _model_admins():
        info = f"{model._meta.app_label}_{model._meta.model_name}"
        url = reverse(f"admin:{info}_changelist")
        changelist = su_client.get(url).context["cl"]
        for spec in changelist.filter_specs:
            for choice in spec.choices(changelist):
                response = su_client.get(url + choice["query_string"])
                assert response.status_code == 200, (info, choice["query_string"])


def test_run_list_search_and_filters(su_client: Any, populated: dict[str, Any]) -> None:
    url = reverse("admin:runs_run_changelist")
    run = populated["run"]
    for query in (
        f"?q={run.pk}",
        "?q=not-a-uuid",
        f"?q={run.task.repository.name}",
        "?liveness=stuck",
        "?liveness=stalled",
        "?failure_reason=budget_cost",
        f"?task__workspace__id__exact={run.task.workspace_id}",
        f"?task__repository__id__exact={run.task.repository_id}",
    ):
        assert su_client.get(url + query).status_code == 200, query
    found = su_client.get(url + "?failure_reason=budget_cost").context["cl"].result_list
    assert [r.pk for r in found] == [populated["failed"].pk]


def test_stuck_filter_finds_runs_whose_lease_expired(su_client: Any, db: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    stuck = RunFactory(
        status=Run.Status.RUNNING,
        lease_owner="w1",
        lease_until=timezone.now() - timedelta(seconds=30),
    )
    RunFactory(
        status=Run.Status.RUNNING,
        lease_owner="w2",
        lease_until=timezone.now() + timedelta(seconds=30),
    )
    response = su_client.get(reverse("admin:runs_run_changelist") + "?liveness=stuck")
    assert [r.pk for r in response.context["cl"].result_list] == [stuck.pk]
    assert "lease expired" in response.content.decode()
