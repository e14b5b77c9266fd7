"""A run's wake-up is the first thing sent when the state that needs it commits."""

from __future__ import annotations

import pytest

import jobs.relay
from runs import dispatch
from runs.models import Run
from runs.services import run_cancel_request, task_submit
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(dispatch, "run_wake", lambda **kwargs: order.append("run"))
    monkeypatch.setattr(jobs.relay, "relay_wake", lambda **kwargs: order.append("relay"))
    return order


def test_a_submissions_run_is_woken_before_the_relay(
    workspace, repository, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        task_submit(workspace=workspace, repository=repository, instruction="fix it")
    assert sent == ["run", "relay"]


def test_a_cancelled_runs_wake_up_goes_before_the_relay(
    repository, sent, django_capture_on_commit_callbacks
):
    task = TaskFactory(workspace=repository.workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_cancel_request(run=run, by="operator", reason="not needed")
    assert sent == ["run", "relay"]
