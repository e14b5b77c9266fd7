"""Admission far from the limits runs side by side; the limits still hold under a race."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction

from runs import dispatch
from runs.models import Run, Task
from runs.services import task_submit
from runs.services.admission import _admission_counts, _lock_workspace, admission_check
from runs.state import TERMINAL
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_wakeups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Nothing steps these runs: the test is about admission. They end cancelled, so no
    # sweep of another process still running against this database picks them up while
    # the database is flushed.
    monkeypatch.setattr(dispatch, "run_wake", lambda **kwargs: None)
    yield
    Run.objects.exclude(status__in=TERMINAL).update(status=Run.Status.CANCELLED)


@contextmanager
def _held_open(body: Callable[[], Any]) -> Iterator[threading.Event]:
    """Run ``body`` in a transaction of another thread and keep that transaction open
    until the block ends, or until the yielded event is set."""
    ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                body()
                ready.set()
                release.wait(30)
        finally:
            connections.close_all()

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert ready.wait(30)
        yield release
    finally:
        release.set()
        other.join(30)


def test_limits_hold_when_many_submit_at_once(settings: Any) -> None:
    settings.ADMISSION_LANES = 4
    workspace = WorkspaceFactory(max_active_runs=10)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=50)
    start = threading.Barrier(12)

    def submit(i: int) -> str:
        try:
            start.wait() if i < 12 else None
            return task_submit(
                workspace=workspace, repository=repository, instruction=f"task {i}"
            ).status
        finally:
            connections.close_all()

    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(submit, range(40)))
    assert statuses.count(Task.Status.RUNNING) == 10
    assert statuses.count(Task.Status.DEFERRED) == 30
    assert Run.objects.filter(task__workspace=workspace).count() == 10


def test_a_submission_does_not_wait_for_another_in_flight(settings: Any) -> None:
    settings.ADMISSION_LANES = 8
    workspace = WorkspaceFactory(max_active_runs=1000)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=1000)
    # A submission whose transaction is still open (e.g. a slow commit).
    first = partial(task_submit, workspace=workspace, repository=repository, instruction="first")
    try:
        with _held_open(first):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '3s'")
            try:
                second = task_submit(
                    workspace=workspace, repository=repository, instruction="second"
                )
            except OperationalError as exc:  # a lock wait that would serialise submissions
                pytest.fail(f"the second submission waited for the first: {exc}")
            assert second.status == Task.Status.RUNNING
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert Run.objects.filter(task__workspace=workspace).count() == 2


def test_submissions_over_the_limit_are_deferred_side_by_side(settings: Any) -> None:
    settings.ADMISSION_LANES = 4
    workspace = WorkspaceFactory(max_active_runs=1)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=10)
    task_submit(workspace=workspace, repository=repository, instruction="first")
    # A deferred submission whose transaction is still open.
    second = partial(task_submit, workspace=workspace, repository=repository, instruction="second")
    try:
        with _held_open(second):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '3s'")
            try:
                third = task_submit(workspace=workspace, repository=repository, instruction="third")
            except OperationalError as exc:  # deferring one at a time, as a burst would queue
                pytest.fail(f"a deferral waited for another deferral: {exc}")
            assert third.status == Task.Status.DEFERRED
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert Task.objects.filter(workspace=workspace, status=Task.Status.DEFERRED).count() == 2


def _advisory_locks_held() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_the_count_holds_exactly_one_lane(settings: Any) -> None:
    settings.ADMISSION_LANES = 8
    workspace = WorkspaceFactory(max_active_runs=10)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=10)
    with transaction.atomic():
        assert admission_check(workspace=workspace, repository=repository, lane=True) is None
        assert _advisory_locks_held() == 1  # a free lane: the wait was never evaluated
    assert _advisory_locks_held() == 0


def test_with_every_lane_busy_the_count_waits_for_one(settings: Any) -> None:
    settings.ADMISSION_LANES = 4
    workspace = WorkspaceFactory(max_active_runs=10)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=10)

    def exclusive() -> None:
        _lock_workspace(workspace.pk)  # every lane
        task_submit(workspace=workspace, repository=repository, instruction="first")

    with _held_open(exclusive) as release:
        threading.Timer(0.5, release.set).start()
        with transaction.atomic():
            refusal = admission_check(workspace=workspace, repository=repository, lane=True)
            assert release.is_set()  # it waited for the exclusive holder
            assert _advisory_locks_held() == 1
    # Counted after the wait: the run admitted meanwhile is in the count.
    assert refusal is None
    with transaction.atomic():
        assert (
            _admission_counts(
                workspace_id=workspace.pk, repository_id=None, spend=False, lane=True
            )[0]
            == 1
        )


def test_a_submission_counts_after_the_lane_it_waited_for(settings: Any) -> None:
    """A submission counts after taking its lane: admissions committed while it waited are
    in its count. Counted with a snapshot from
    before the wait, the fourth submission below would have run over the limit of 3."""
    settings.ADMISSION_LANES = 1
    workspace = WorkspaceFactory(max_active_runs=3)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=10)

    def three_at_once() -> None:
        _lock_workspace(workspace.pk)  # every lane, until this transaction ends
        for n in range(3):
            task_submit(workspace=workspace, repository=repository, instruction=f"task {n}")

    with _held_open(three_at_once) as release:
        threading.Timer(0.5, release.set).start()
        fourth = task_submit(workspace=workspace, repository=repository, instruction="fourth")
        assert release.is_set()  # it waited for the lane
    assert fourth.status == Task.Status.DEFERRED
    assert Run.objects.filter(task__workspace=workspace).count() == 3


def test_a_submission_takes_the_free_lane_and_counts_in_its_stripe(settings: Any) -> None:
    """With every lane of the workspace but one held elsewhere a submission takes that
    one without waiting, and its run is counted in that lane's stripe (the lane is
    recorded before the run's row is written)."""
    from runs.models import ActiveRunCount
    from runs.services.admission import _LANE_KEY

    settings.ADMISSION_LANES = 8
    workspace = WorkspaceFactory(max_active_runs=100)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=100)

    def seven_lanes() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_advisory_xact_lock(%s + lane, %s))"
                " FROM generate_series(0, 6) AS lane",
                [_LANE_KEY, workspace.pk],
            )

    with _held_open(seven_lanes):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # a wait would fail the test
        try:
            submission = task_submit(workspace=workspace, repository=repository, instruction="x")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    assert submission.task.status == Task.Status.RUNNING
    counted = ActiveRunCount.objects.filter(workspace_id=workspace.pk, runs__gt=0)
    assert sorted(counted.values_list("repository_id", "stripe")) == [
        (0, 7),
        (repository.pk, 7),
    ]
