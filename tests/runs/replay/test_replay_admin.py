"""The console: replay selected runs, then read each replay's report on its page."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.urls import reverse

from jobs.models import WorkItem
from runs.models import Run, RunReplay
from runs.replay.reproduce import REPLAY_WORK
from tests.factories import RunFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def op_client(client: Any) -> Any:
    user = UserFactory(username="oncall", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    client.force_login(user)
    return client


def test_an_operator_replays_finished_runs_and_reads_the_replay(
    op_client, django_capture_on_commit_callbacks
):
    finished = RunFactory(status=Run.Status.COMPLETED)
    active = RunFactory(status=Run.Status.RUNNING)

    with django_capture_on_commit_callbacks():
        response = op_client.post(
            reverse("admin:runs_run_changelist"),
            {
                "action": "replay_runs",
                ACTION_CHECKBOX_NAME: [str(finished.pk), str(active.pk)],
                "index": 0,
            },
            follow=True,
        )

    replay = RunReplay.objects.get()
    assert replay.run_id == finished.pk and replay.requested_by == "oncall"
    assert WorkItem.objects.filter(kind=REPLAY_WORK, key=str(replay.id)).exists()
    assert get_messages(response.wsgi_request)
    outcomes = {
        run.pk: run.events.get(type="agent.run.operator_action").data["outcome"]
        for run in (finished, active)
    }
    assert outcomes == {finished.pk: "done", active.pk: "refused"}
    page = op_client.get(reverse("admin:runs_runreplay_change", args=[replay.pk]))
    assert page.status_code == 200 and str(finished.pk) in page.content.decode()
    assert op_client.get(reverse("admin:runs_runreplay_changelist")).status_code == 200
