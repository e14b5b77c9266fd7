"""Follow-ups and retries: admitted like submissions, never stranded, never a second PR
number from the local provider."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connections
from django.db.models import Q

from jobs.models import WorkItem
from jobs.work import WorkKind, work_kind, work_kind_register, work_sweep
from jobs.work_execution import work_execute
from runs.ending import AFTER_TERMINAL, run_end_unleased
from runs.gitproviders.local import LocalGitProvider
from runs.models import PullRequest, Run, Task
from runs.services import CommandRefused, task_followup, task_retry, tasks_readmit
from runs.state import ACTIVE
from tests.conftest import free_port
from tests.factories import RepositoryFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _ended_task(workspace, repository) -> Task:
    task = TaskFactory(workspace=workspace, repository=repository, status=Task.Status.COMPLETED)
    Run.objects.create(task=task, run_no=1, status=Run.Status.COMPLETED)
    return task


def _busy(workspace, repository) -> Run:
    other = TaskFactory(workspace=workspace, repository=repository)
    return Run.objects.create(task=other, run_no=1)


def test_followup_and_retry_respect_the_active_run_limit(workspace, repository):
    workspace.max_active_runs = 1
    workspace.save()
    task = _ended_task(workspace, repository)
    blocker = _busy(workspace, repository)

    assert task_followup(task=task, feedback="please rename it", by="reviewer") is None
    with pytest.raises(CommandRefused) as refused:
        task_retry(task=task, by="operator")
    assert refused.value.code == "no_capacity"

    active = Run.objects.filter(task__workspace=workspace, status__in=ACTIVE)
    assert active.count() == 1
    task.refresh_from_db()
    assert (task.status, task.pending_feedback) == (Task.Status.DEFERRED, "please rename it")

    # Capacity frees: the deferred follow-up starts with its feedback.
    Run.objects.filter(pk=blocker.pk).update(status=Run.Status.COMPLETED)
    assert tasks_readmit() == 1
    followup = task.runs.get(run_no=2)
    assert followup.feedback == "please rename it"
    task.refresh_from_db()
    assert task.pending_feedback == ""


def test_batched_feedback_starts_its_followup_although_the_broker_refused(
    workspace, repository, broker_at
):
    task = TaskFactory(workspace=workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1)
    assert task_followup(task=task, feedback="also fix sub()", by="reviewer") is None

    # The run ends while nothing can reach the broker, and the in-process fast path
    # fails too: only the row remains.
    broker_at(f"redis://127.0.0.1:{free_port()}/0")

    def refuse(**kwargs):
        raise ConnectionError("the database went away before the follow-up started")

    original = work_kind(AFTER_TERMINAL)
    work_kind_register(WorkKind(name=AFTER_TERMINAL, handler=refuse))
    try:
        assert run_end_unleased(run_id=run.pk, target=Run.Status.FAILED, reason="step_error")
    finally:
        work_kind_register(original)
    assert not task.runs.filter(run_no=2).exists()
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.PENDING

    # What the sweep's wake-up makes a worker do, done here in-process.
    broker_at(None)
    WorkItem.objects.filter(pk=item.pk).update(due_at=item.created_at)
    assert work_execute(item_id=item.pk) == "done"
    followup = task.runs.get(run_no=2)
    assert followup.feedback == "also fix sub()"
    assert work_sweep().woken == 0


def test_a_run_end_runs_its_after_terminal_work_without_a_wake_up(
    workspace, repository, monkeypatch
):
    from jobs import work

    woken: list[int] = []
    wake = work.work_wake

    def spy(pairs, **kwargs):
        woken.extend(pk for pk, _ in pairs)
        return wake(pairs, **kwargs)

    monkeypatch.setattr(work, "work_wake", spy)
    task = TaskFactory(workspace=workspace, repository=repository, pending_feedback="also fix")
    run = Run.objects.create(task=task, run_no=1)
    assert run_end_unleased(run_id=run.pk, target=Run.Status.FAILED, reason="step_error")

    # Done in the ending process right after the commit; no message was sent for it.
    item = WorkItem.objects.get(kind=AFTER_TERMINAL, key=str(run.pk))
    assert item.status == WorkItem.Status.DONE
    assert item.pk not in woken

    # Had that process died first, the sweep wakes the item once it is overdue.
    WorkItem.objects.filter(pk=item.pk).update(
        status=WorkItem.Status.PENDING,
        finished_at=None,
        created_at=item.created_at - timedelta(seconds=settings.WORK_REWAKE_SECONDS + 1),
    )
    assert work_sweep().woken == 1
    assert woken == [item.pk]


def test_local_pull_request_numbers_are_never_shared(workspace, tmp_path):
    repository = RepositoryFactory(workspace=workspace, clone_url=str(tmp_path), provider="local")
    provider = LocalGitProvider()
    numbers: list[int | None] = []
    barrier = threading.Barrier(6)

    def open_one(n: int) -> None:
        try:
            barrier.wait()
            info = provider.pull_request_ensure(
                repository=repository,
                branch=f"agent/task-{n}",
                base_branch="main",
                title="t",
                body="b",
                head_sha="f" * 40,
            )
            numbers.append(info.number)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(numbers) == [1, 2, 3, 4, 5, 6]
    assert not PullRequest.objects.filter(~Q(number=None)).exists()


def test_followup_after_the_pull_request_was_merged_is_refused(workspace, repository):
    task = _ended_task(workspace, repository)
    PullRequest.objects.create(
        task=task,
        provider="local",
        branch="agent/x",
        base_branch="main",
        number=1,
        state=PullRequest.State.MERGED,
    )
    with pytest.raises(CommandRefused) as refused:
        task_followup(task=task, feedback="one more thing", by="reviewer")
    assert refused.value.code == "pull_request_merged"
    assert task.runs.count() == 1
