"""A finished run's follow-up work runs in the process that ended it, without a message;
its wake-up is sent only when that could not happen."""

from __future__ import annotations

import pytest
from django.db import OperationalError

import jobs.work
import jobs.work_execution
from jobs.models import WorkItem
from runs.ending import AFTER_TERMINAL, run_end_unleased
from runs.models import Run, Task
from runs.services import run_after_terminal
from tests.factories import TaskFactory

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


def _feedback_waits(run: Run) -> None:
    """Feedback batched on the run's task: its end leaves work for the after-terminal
    item."""
    Task.objects.filter(pk=run.task_id).update(pending_feedback="also fix sub()")


def test_the_follow_up_work_runs_at_once_and_sends_no_wake_up(
    run, wakes, django_capture_on_commit_callbacks
):
    _feedback_waits(run)
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

    monkeypatch.setattr(jobs.work_execution, "work_execute", unreachable)
    _feedback_waits(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_end_unleased(run_id=run.pk, target=S.FAILED, reason="step_error")
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.PENDING
    assert wakes == [[(item.pk, item.queue)]]


def test_a_run_end_with_nothing_waiting_records_no_follow_up_work(
    run, wakes, django_capture_on_commit_callbacks
):
    """No batched feedback and no deferred task in the workspace, read by the ending
    transaction: no item to write, claim and finish."""
    with django_capture_on_commit_callbacks(execute=True):
        assert run_end_unleased(run_id=run.pk, target=S.FAILED, reason="step_error")
    assert not WorkItem.objects.filter(kind=AFTER_TERMINAL, key=str(run.pk)).exists()
    assert wakes == []


def test_a_deferred_task_makes_the_run_end_record_its_follow_up_work(
    run, wakes, django_capture_on_commit_callbacks
):
    waiting = TaskFactory(
        workspace=run.task.workspace, repository=run.task.repository, status=Task.Status.DEFERRED
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert run_end_unleased(run_id=run.pk, target=S.FAILED, reason="step_error")
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.DONE
    waiting.refresh_from_db()
    assert waiting.status == Task.Status.RUNNING


def test_the_follow_up_work_lets_a_deferred_task_in(run) -> None:
    Run.objects.filter(pk=run.pk).update(status=S.FAILED)
    waiting = TaskFactory(
        workspace=run.task.workspace, repository=run.task.repository, status=Task.Status.DEFERRED
    )
    run_after_terminal(run_id=run.pk)
    waiting.refresh_from_db()
    assert waiting.status == Task.Status.RUNNING
    assert Run.objects.filter(task=waiting).count() == 1
