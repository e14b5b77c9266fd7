"""A request whose transaction committed answers with what it stored, even when the
broker refuses the wake-up afterwards; the stall sweep sends it later."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from rest_framework.test import APIClient

from runs.models import Membership, Task
from runs.services import run_recover_stalled
from tests.conftest import free_port, queue_lists
from tests.factories import RepositoryFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_submission_during_a_broker_outage_answers_202_with_the_stored_task(
    workspace, broker_at, own_redis
):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.MEMBER)
    client = APIClient()
    client.force_authenticate(user)
    repository = RepositoryFactory(workspace=workspace)
    broker_at(f"redis://127.0.0.1:{free_port()}/0")  # every send is refused

    response = client.post(
        "/api/tasks/", {"repository": repository.pk, "instruction": "Fix add()"}, format="json"
    )

    assert response.status_code == 202, response.content
    task = Task.objects.get()
    assert response.json()["task_id"] == str(task.id)
    assert task.runs.count() == 1

    # The broker is back: the stall sweep sends the wake-up the request could not.
    broker_at(own_redis.url)
    assert run_recover_stalled(stall_after=timedelta(0)) == 1
    broker = redis.Redis.from_url(own_redis.url)
    assert sum(broker.llen(key) for key in queue_lists("agent")) == 1
    assert Task.objects.count() == 1
