"""Rebuild: every run's state recomputed from its events agrees with the stored state."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run, Task
from runs.replay.fold import run_check, run_rebuild
from runs.services import run_cancel_request, task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def _run(workspace, repository, script, **options) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
        **options,
    )
    return run_drive_inline(run_id=submission.run.id)


def test_rebuild_agrees_with_every_scenario_run(workspace, repository):
    repository.max_active_runs = 10
    repository.save()
    completed = _run(workspace, repository, demo.fix_script())
    failed = _run(workspace, repository, {"turns": [{"tool_calls": [{"name": "finish"}]}]})
    waiting = _run(
        workspace,
        repository,
        demo.fix_script(),
        execution_mode=Task.Mode.SUPERVISED_PR,
        risk_level=Task.Risk.HIGH,
    )
    queued = task_submit(workspace=workspace, repository=repository, instruction="Fix add()").run
    run_cancel_request(run=queued, by="t", reason="not needed")
    run_drive_inline(run_id=queued.id)
    statuses = {r.id: r.status for r in Run.objects.all()}
    assert statuses[completed.id] == "completed"
    assert statuses[failed.id] == "failed"
    assert statuses[waiting.id] == "awaiting_approval"
    assert statuses[queued.id] == "cancelled"

    for run in Run.objects.all():
        drift = run_check(run)
        assert not drift.drifted, (run.status, drift.fields)
    out = io.StringIO()
    call_command("runs_check", stdout=out)
    assert "0 run(s) drifted" in out.getvalue()


def test_drift_is_reported(workspace, repository):
    run = _run(workspace, repository, demo.fix_script())
    Run.objects.filter(pk=run.pk).update(tokens_in=run.tokens_in + 7, status="failed")
    run.refresh_from_db()

    drift = run_check(run)

    assert drift.fields["tokens_in"] == (run.tokens_in, run.tokens_in - 7)
    assert drift.fields["status"] == ("failed", "completed")
    with pytest.raises(CommandError, match="1 run"):
        call_command("runs_check", stdout=io.StringIO())


def test_snapshots_let_a_rebuild_read_only_the_newer_events(workspace, repository):
    run = _run(workspace, repository, demo.fix_script())
    total = run.events.count()

    first = run_rebuild(run, snapshot_every=5)
    again = run_rebuild(run, snapshot_every=5)

    assert first.events_folded == total and first.from_snapshot == 0
    assert again.from_snapshot == total - total % 5
    assert again.events_folded == total % 5
    assert again.state == first.state
