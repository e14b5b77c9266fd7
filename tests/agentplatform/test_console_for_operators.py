"""The console as an on-call operator meets it: the platform's name, an operator's menu,
search by the short ids the lists show, history nobody can delete, and a dead letter's
page that acts and links to what it carries."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from jobs.models import DeadLetter
from runs.models import Run
from tests.factories import DeadLetterFactory, RunFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_client(client: Any) -> Any:
    user = UserFactory(username="oncall", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client(client: Any) -> Any:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def _apps(response: Any) -> list[str]:
    return [app["app_label"] for app in response.context["app_list"]]


def test_the_console_carries_the_platforms_name_and_an_operators_menu(operator_client):
    page = operator_client.get(reverse("admin:index"))

    html = page.content.decode()
    assert "agentplatform console" in html
    assert "Django administration" not in html
    assert _apps(page)[:3] == ["runs", "jobs", "webhooks"]
    assert not {"django_celery_results", "django_celery_beat", "auth"} & set(_apps(page))


def test_a_superuser_still_finds_the_library_tables(superuser_client):
    apps = _apps(superuser_client.get(reverse("admin:index")))
    assert apps[:3] == ["runs", "jobs", "webhooks"]
    assert {"django_celery_results", "django_celery_beat", "auth"} <= set(apps)


def test_the_short_id_a_list_shows_finds_its_run(operator_client):
    wanted, other = RunFactory(), RunFactory()
    url = reverse("admin:runs_run_changelist")

    for query in (wanted.short_id, f"{wanted.short_id} #1", str(wanted.id)[:13]):
        found = list(operator_client.get(url, {"q": query}).context["cl"].result_list)
        assert wanted in found, query
        if query != str(wanted.id)[:13]:  # the start of an id is shared by its minute
            assert other not in found, query
    by_task = operator_client.get(url, {"q": wanted.task_id.hex[-8:]})
    assert wanted in list(by_task.context["cl"].result_list)


def test_history_cannot_be_deleted_even_by_a_superuser(superuser_client):
    run = RunFactory()
    letter = DeadLetterFactory()

    for name, pk in (
        ("runs_run", run.pk),
        ("runs_task", run.task_id),
        ("jobs_deadletter", letter.pk),
    ):
        assert superuser_client.post(reverse(f"admin:{name}_delete", args=[pk])).status_code == 403
        changelist = superuser_client.get(reverse(f"admin:{name}_changelist"))
        assert (
            "delete_selected"
            not in changelist.context["action_form"].fields["action"].choices.__str__()
        )
    assert Run.objects.filter(pk=run.pk).exists()
    assert DeadLetter.objects.filter(pk=letter.pk).exists()
    repository = run.task.repository
    assert (
        superuser_client.get(
            reverse("admin:runs_repository_delete", args=[repository.pk])
        ).status_code
        == 200
    )


def test_a_run_page_is_headed_by_the_run_and_links_its_task(operator_client):
    run = RunFactory()

    html = operator_client.get(reverse("admin:runs_run_change", args=[run.pk])).content.decode()

    assert f"Run {run.short_id} #{run.run_no}" in html
    assert str(run.task_id) not in html.split("<h1>")[1].split("</h1>")[0]
    assert reverse("admin:runs_task_change", args=[run.task_id]) in html


def test_a_dead_letter_page_links_its_run_and_requeues_it(operator_client):
    run = RunFactory()
    letter = DeadLetterFactory(task_name="runs.step", args=[str(run.id), 3])
    page_url = reverse("admin:jobs_deadletter_change", args=[letter.pk])

    html = operator_client.get(page_url).content.decode()
    assert reverse("admin:runs_run_change", args=[run.pk]) in html
    assert 'id="action-requeue"' in html and 'id="action-discard"' in html

    response = operator_client.post(
        reverse("admin:jobs_deadletter_operate", args=[letter.pk, "requeue"])
    )
    assert response.status_code == 302
    letter.refresh_from_db()
    assert (letter.status, letter.resolved_by) == (DeadLetter.Status.REQUEUED, "oncall")
    assert 'id="action-requeue"' not in operator_client.get(page_url).content.decode()


def test_a_viewer_without_the_operator_role_cannot_requeue_from_the_page(client):
    from django.contrib.auth.models import Permission

    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client.force_login(viewer)
    letter = DeadLetterFactory()

    response = client.post(reverse("admin:jobs_deadletter_operate", args=[letter.pk, "discard"]))

    assert response.status_code == 403
    letter.refresh_from_db()
    assert letter.status == DeadLetter.Status.OPEN
