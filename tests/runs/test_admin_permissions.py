"""Staff only; operators act but do not edit raw rows; superusers may edit."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Group
from django.urls import reverse

from jobs.models import DeadLetter
from runs.models import Run
from tests.factories import DeadLetterFactory, RunFactory, UserFactory, WorkspaceFactory


@pytest.fixture
def operator_client(client: Any, db: Any) -> Any:
    user = UserFactory(username="oncall", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    client.force_login(user)
    return client


def test_anonymous_and_non_staff_users_are_sent_to_login(client: Any, db: Any) -> None:
    for url in (reverse("admin:runs_run_changelist"), reverse("ops-dashboard")):
        assert client.get(url).status_code == 302
    client.force_login(UserFactory(username="member"))
    for url in (reverse("admin:runs_run_changelist"), reverse("ops-dashboard")):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_operator_sees_the_console_but_rows_are_read_only(operator_client: Any) -> None:
    workspace = WorkspaceFactory()
    run = RunFactory(task__workspace=workspace)

    assert operator_client.get(reverse("ops-dashboard")).status_code == 200
    page = operator_client.get(reverse("admin:runs_workspace_change", args=[workspace.pk]))
    assert page.status_code == 200
    assert page.context["has_change_permission"] is False
    response = operator_client.post(
        reverse("admin:runs_workspace_change", args=[workspace.pk]),
        {"slug": "hijacked", "name": "x", "max_active_runs": 1, "daily_cost_budget_usd": "0"},
    )
    assert response.status_code == 403
    workspace.refresh_from_db()
    assert workspace.slug != "hijacked"
    assert operator_client.get(reverse("admin:runs_run_change", args=[run.pk])).status_code == 200
    assert operator_client.get(reverse("admin:runs_workspace_add")).status_code == 403
    assert operator_client.post(reverse("admin:runs_run_delete", args=[run.pk])).status_code == 403


def test_staff_without_the_operator_role_cannot_act(client: Any, db: Any) -> None:
    from django.contrib.auth.models import Permission

    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client.force_login(viewer)
    letter = DeadLetterFactory()
    url = reverse("admin:jobs_deadletter_changelist")

    page = client.get(url)
    assert page.status_code == 200
    assert page.context["action_form"] is None, "no action is offered to a viewer"
    client.post(url, {"action": "requeue", ACTION_CHECKBOX_NAME: [str(letter.pk)], "index": 0})
    letter.refresh_from_db()
    assert letter.status == DeadLetter.Status.OPEN
    run = RunFactory()
    response = client.post(reverse("admin:runs_run_operate", args=[run.pk, "cancel"]))
    assert response.status_code in (302, 403)
    run.refresh_from_db()
    assert run.cancel_requested_at is None


def test_superuser_may_edit_tenants_but_not_runs_or_queue_rows(client: Any, db: Any) -> None:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    workspace = WorkspaceFactory()
    run = RunFactory(task__workspace=workspace)
    letter = DeadLetterFactory()

    page = client.get(reverse("admin:runs_workspace_change", args=[workspace.pk]))
    assert page.context["has_change_permission"] is True
    for url in (
        reverse("admin:runs_run_change", args=[run.pk]),
        reverse("admin:jobs_deadletter_change", args=[letter.pk]),
    ):
        assert client.get(url).context["has_change_permission"] is False
    assert Run.objects.filter(pk=run.pk).exists()


def test_daily_spend_is_shown_but_nobody_edits_or_deletes_it(client: Any, db: Any) -> None:
    from django.utils import timezone

    from runs.models import WorkspaceSpend

    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    workspace = WorkspaceFactory(daily_cost_budget_usd="5.00")
    spend = WorkspaceSpend.objects.create(
        workspace=workspace, day=timezone.now().date(), cost_usd="1.25", updated_at=timezone.now()
    )

    listing = client.get(reverse("admin:runs_workspacespend_changelist"))
    assert listing.status_code == 200
    assert b"1.250000" in listing.content and b"5.00" in listing.content

    page = client.get(reverse("admin:runs_workspacespend_change", args=[spend.pk]))
    assert page.context["has_change_permission"] is False
    assert page.context["has_delete_permission"] is False
    posted = client.post(
        reverse("admin:runs_workspacespend_change", args=[spend.pk]), {"cost_usd": "0"}
    )
    assert posted.status_code == 403
    deleted = client.post(
        reverse("admin:runs_workspacespend_delete", args=[spend.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 403
    spend.refresh_from_db()
    assert str(spend.cost_usd) == "1.250000"
