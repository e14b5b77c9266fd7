"""The operators' commands: replay, fork, re-deliver, export and import."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from jobs.models import ProcessedEvent
from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run, RunImport, RunReplay
from runs.services import task_submit
from tests.factories import WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


@pytest.fixture
def finished(workspace, repository) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    return run_drive_inline(run_id=submission.run.id)


def _call(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_run_replay_reports_a_reproduction(finished):
    output = _call("run_replay", finished.short_id)  # as the console shows it

    replay = RunReplay.objects.get(run=finished)
    assert f"replay {replay.id}: reproduced" in output


def test_run_replay_refuses_an_unknown_run():
    with pytest.raises(CommandError, match="no run has an id"):
        _call("run_replay", "deadbeefdead")


def test_run_fork_queues_a_fork(finished):
    output = _call("run_fork", str(finished.id), "--turn", "1")

    fork = Run.objects.exclude(pk=finished.pk).get()
    assert f"fork run {fork.id}" in output and fork.status == Run.Status.QUEUED
    with pytest.raises(CommandError, match="model turns"):
        _call("run_fork", str(finished.id), "--turn", "99")


def test_events_redeliver_counts_first_and_applies_with_apply(finished, settings):
    settings.EVENT_CONSUMERS = [
        *settings.EVENT_CONSUMERS,
        "tests.runs.replay.test_consumer_redelivery.COUNTER",
    ]
    events = finished.events.count()

    dry = _call("events_redeliver", "test-counter", "--run", str(finished.id))
    assert f"{events} events, {events} of its types, 0 already processed" in dry
    assert not ProcessedEvent.objects.filter(consumer="test-counter").exists()

    applied = _call("events_redeliver", "test-counter", "--run", str(finished.id), "--apply")
    assert f"delivered {events}" in applied
    again = _call("events_redeliver", "test-counter", "--workspace", finished.workspace.slug)
    assert f"{events} already processed, 0 to deliver" in again


def test_export_then_import_on_the_command_line(finished, tmp_path):
    archive = tmp_path / "run.tar.gz"
    _call("run_export", str(finished.id), str(archive))
    target = WorkspaceFactory()

    output = _call("run_import", str(archive), "--workspace", target.slug)

    imported = RunImport.objects.get(source_run_id=finished.id).run
    assert f"imported as run {imported.id}" in output
    assert imported.workspace_id == target.pk
