"""Admission's counts of active runs (``ActiveRunCount``, kept by triggers on runs) agree
with the runs after every way a run is written: the ORM, bulk updates, raw SQL,
deletes, a truncate, a rolled-back transaction, and submissions and run ends racing on
separate connections. ``active_runs_recount`` finds and repairs counts written around
the triggers."""

from __future__ import annotations

import importlib
import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.db.models import Sum

from runs import dispatch
from runs.active_runs import Drift, recount
from runs.models import ActiveRunCount, Run, Task
from runs.services import task_submit
from runs.services.admission import LANE_SETTING, _lanes, admission_check
from runs.state import ACTIVE, TERMINAL
from tests.factories import RepositoryFactory, TaskFactory, WorkspaceFactory

pytestmark = [pytest.mark.services, pytest.mark.django_db]

migration = importlib.import_module("runs.migrations.0020_active_run_counts")


def _counted() -> dict[tuple[int, int], int]:
    """The active runs, as the triggers should have counted them."""
    counts: Counter[tuple[int, int]] = Counter()
    for ws, repo in Run.objects.filter(status__in=ACTIVE).values_list(
        "workspace_id", "repository_id"
    ):
        counts[ws, 0] += 1
        counts[ws, repo] += 1
    return dict(counts)


def _stored() -> dict[tuple[int, int], int]:
    rows = ActiveRunCount.objects.values("workspace_id", "repository_id").annotate(n=Sum("runs"))
    return {(r["workspace_id"], r["repository_id"]): r["n"] for r in rows if r["n"]}


def _run(repository: Any, status: str = "queued") -> Run:
    task = TaskFactory(workspace=repository.workspace, repository=repository)
    return Run.objects.create(task=task, run_no=1, status=status)


def test_the_counts_follow_every_way_a_run_is_written() -> None:
    workspace, other = WorkspaceFactory(), WorkspaceFactory()
    mine, sibling = RepositoryFactory(workspace=workspace), RepositoryFactory(workspace=workspace)
    elsewhere = RepositoryFactory(workspace=other)
    runs = [
        _run(repository, status)
        for repository in (mine, sibling, elsewhere)
        for status in [*sorted(ACTIVE), "completed", "cancelled"]
    ]
    assert _stored() == _counted() != {}

    steps = [
        # One run through its statuses, active to active and active to terminal.
        lambda: Run.objects.filter(pk=runs[0].pk).update(status="preparing"),
        lambda: Run.objects.filter(pk=runs[0].pk).update(status="completed"),
        # Back from terminal to active.
        lambda: Run.objects.filter(pk=runs[0].pk).update(status="queued"),
        # Many at once, across workspaces.
        lambda: Run.objects.filter(status="queued").update(status="cancelled"),
        lambda: Run.objects.filter(status="cancelled").update(status="planning"),
        # Moved to another repository and another workspace.
        lambda: Run.objects.filter(repository=mine).update(repository=sibling),
        lambda: Run.objects.filter(repository=sibling, status="running").update(
            workspace=other, repository=elsewhere
        ),
        # Saved through the model.
        lambda: _save_status(runs[5], "failed"),
        # Raw SQL, bypassing the ORM.
        lambda: _execute("UPDATE runs_run SET status = 'timed_out' WHERE status = 'verifying'"),
        # Deleted: one, then a workspace's (cascading from its tasks).
        lambda: Run.objects.filter(pk=runs[1].pk).delete(),
        lambda: Task.objects.filter(workspace=other).delete(),
    ]
    for n, step in enumerate(steps):
        step()
        assert _stored() == _counted(), f"after step {n}"


def _save_status(run: Run, status: str) -> None:
    run.refresh_from_db()
    run.status = status
    run.save(update_fields=["status"])


def _execute(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


def test_a_rolled_back_transaction_counts_nothing() -> None:
    repository = RepositoryFactory()
    _run(repository)
    before = _stored()
    with pytest.raises(RuntimeError), transaction.atomic():
        _run(repository)
        Run.objects.update(status="completed")
        raise RuntimeError("rolled back")
    assert _stored() == before == _counted()


@pytest.mark.django_db(transaction=True)
def test_a_truncate_of_the_runs_empties_the_counts() -> None:
    _run(RepositoryFactory())
    assert _stored()
    _execute("TRUNCATE runs_run CASCADE")
    assert _stored() == {} == _counted()
    _run(RepositoryFactory())
    assert _stored() == _counted() != {}


def test_a_steps_other_updates_do_not_touch_the_counts() -> None:
    """Leases, heartbeats and checkpoints update runs all the time: the triggers' WHEN
    leaves those out without calling the function."""
    run = _run(RepositoryFactory(), "running")
    _execute("UPDATE runs_activeruncount SET runs = runs + 100")  # marked
    marked = _stored()
    Run.objects.filter(pk=run.pk).update(step_no=5, lease_owner="w1", checkpoint={"a": 1})
    Run.objects.filter(pk=run.pk).update(status="verifying")  # active to active
    assert _stored() == marked


def test_admission_reads_the_counts() -> None:
    """What admission refuses on is the stored count: a count written wrong (here by
    hand) refuses a workspace with no runs, until the recount repairs it."""
    workspace = WorkspaceFactory(max_active_runs=3)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=3)
    assert admission_check(workspace=workspace, repository=repository) is None
    ActiveRunCount.objects.create(workspace_id=workspace.pk, repository_id=0, stripe=-1, runs=3)
    refusal = admission_check(workspace=workspace, repository=repository)
    assert refusal == "workspace at its limit of 3 active runs"

    assert recount() == [Drift(workspace.pk, 0, stored=3, counted=0)]
    with pytest.raises(CommandError, match="1 counts differ"):
        call_command("active_runs_recount")
    call_command("active_runs_recount", "--fix")
    assert recount() == []
    assert admission_check(workspace=workspace, repository=repository) is None


def test_the_migration_counts_the_runs_already_there() -> None:
    """The migration fills the counts from the runs present, then counts with triggers."""
    workspace = WorkspaceFactory()
    repositories = [RepositoryFactory(workspace=workspace) for _ in range(2)]
    with connection.schema_editor() as editor:
        migration.backwards(apps, editor)
    for repository in repositories:
        for status in ("queued", "running", "completed"):
            _run(repository, status)
    ActiveRunCount.objects.all().delete()
    assert _stored() == {}  # no triggers: nothing counted
    with connection.schema_editor() as editor:
        migration.forwards(apps, editor)
    assert (
        _stored()
        == _counted()
        == {
            (workspace.pk, 0): 4,
            (workspace.pk, repositories[0].pk): 2,
            (workspace.pk, repositories[1].pk): 2,
        }
    )
    _run(repositories[0])
    assert _stored() == _counted()


@pytest.fixture
def no_wakeups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Nothing steps these runs; they end cancelled, so no sweep of another process
    # running against this database picks them up while the database is flushed.
    monkeypatch.setattr(dispatch, "run_wake", lambda **kwargs: None)
    yield
    Run.objects.exclude(status__in=TERMINAL).update(status=Run.Status.CANCELLED)


@pytest.mark.django_db(transaction=True)
def test_a_submission_counts_in_its_lanes_stripe(no_wakeups: None) -> None:
    """A submission adds to the stripe of the admission lane it holds, which no other
    submission to the workspace writes while it does; others to a stripe below zero."""
    workspace = WorkspaceFactory(max_active_runs=100)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=100)
    task_submit(workspace=repository.workspace, repository=repository, instruction="go")
    (stripe,) = ActiveRunCount.objects.filter(repository_id=0).values_list("stripe", flat=True)
    assert 0 <= stripe < _lanes()
    with transaction.atomic():
        _execute(f"SELECT set_config('{LANE_SETTING}', '', true)")
        _run(repository)
    stripes = set(ActiveRunCount.objects.values_list("stripe", flat=True))
    assert len(stripes) == 2 and min(stripes) < 0


@pytest.mark.django_db(transaction=True)
def test_racing_submissions_and_run_ends_keep_the_counts_and_the_limit(
    no_wakeups: None,
) -> None:
    """Submissions on four connections race to a workspace's limit while two more end
    runs one by one and in bulk: no deadlock, no error, the limit holds while only
    submissions race, and the counts equal the active runs at the end."""
    limit = 40
    workspace = WorkspaceFactory(max_active_runs=limit)
    repositories = [RepositoryFactory(workspace=workspace, max_active_runs=limit) for _ in range(2)]
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def on_own_connection(body: Any) -> Any:
        def run(*args: Any) -> Any:
            try:
                start.wait(10)
                return body(*args)
            except BaseException as exc:
                errors.append(exc)
                raise
            finally:
                connections.close_all()

        return run

    @on_own_connection
    def submit(n: int) -> None:
        for i in range(25):
            repository = repositories[(n + i) % 2]
            task_submit(workspace=workspace, repository=repository, instruction=f"task {n}.{i}")

    ended = threading.Event()

    @on_own_connection
    def end(n: int) -> None:
        rng = random.Random(n)
        while not ended.is_set():
            active = list(
                Run.objects.filter(workspace=workspace, status__in=ACTIVE).values_list(
                    "pk", flat=True
                )[:5]
            )
            if rng.random() < 0.3:
                Run.objects.filter(pk__in=active).update(status="completed")
            for pk in active[:2]:
                Run.objects.filter(pk=pk).update(status="failed")

    with ThreadPoolExecutor(6) as pool:
        submitted = [pool.submit(submit, n) for n in range(4)]
        enders = [pool.submit(end, n) for n in range(2)]
        for future in submitted:
            future.result(timeout=120)
        ended.set()
        for future in enders:
            future.result(timeout=60)
    assert errors == []
    assert Task.objects.filter(workspace=workspace).count() == 100
    assert _stored() == _counted()

    # Only submissions now: the limit is reached exactly, never passed.
    Run.objects.filter(workspace=workspace).update(status="completed")
    ended.clear()
    start = threading.Barrier(4)
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(submit, n) for n in range(4)]:
            future.result(timeout=120)
    assert errors == []
    assert Run.objects.filter(workspace=workspace, status__in=ACTIVE).count() == limit
    assert _stored() == _counted()
