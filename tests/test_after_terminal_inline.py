"""A finished run's follow-up work runs in the process that ended it, without a message;
its wake-up is sent only when that could not happen."""

from __future__ import annotations

import pytest
from django.db import OperationalError

import jobs.work
from jobs.models import WorkItem
from runs.engine import AFTER_TERMINAL, run_end_unleased
from runs.models import Run

pytestmark = pytest.mark.django_db
S = Run.Status


@pytest.fixture
def wakes(monkeypatch):
    sent: list[list[tuple[int, str]]] = []

    def wake(pairs, **kwargs):
        sent.append(list(pairs))
        return len(pairs)

    monkeypatch.setattr(jobs.work, "work_wake", wake)
    return sent


def test_the_follow_up_work_runs_at_once_and_sends_no_wake_up(
    run, wakes, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert run_end_unleased(run_id=run.pk, target=S.FAILED, reason="step_error")
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.DONE
    assert wakes == []


def test_the_follow_up_work_is_woken_when_it_could_not_run_at_once(
    run, wakes, monkeypatch, django_capture_on_commit_callbacks
):
    def unreachable(**kwargs):
        raise OperationalError("the database went away")

    monkeypatch.setattr(jobs.work, "work_execute", unreachable)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_end_unleased(run_id=run.pk, target=S.FAILED, reason="step_error")
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.PENDING
    assert wakes == [[(item.pk, item.queue)]]
