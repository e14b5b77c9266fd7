"""A replay requested in a transaction is carried out by a real worker process."""

from __future__ import annotations

import pytest

from runs import demo
from runs.models import Run, RunReplay
from runs.replay.reproduce import replay_request
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _finished(model, pk, done):
    row = model.objects.get(pk=pk)
    return row if row.status in done else None


def test_a_replay_is_carried_out_by_a_worker(workspace, repository, start_worker):
    start_worker()
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = wait_for(lambda: _finished(Run, submission.run.pk, TERMINAL), timeout=90, message="run")
    assert run.status == Run.Status.COMPLETED

    replay = replay_request(run=run, by="t")
    done = ("reproduced", "diverged", "errored")
    replay = wait_for(lambda: _finished(RunReplay, replay.pk, done), timeout=90, message="replay")

    assert replay.status == RunReplay.Status.REPRODUCED, replay.divergences
    assert replay.progress == replay.total
    assert run.events.filter(type="agent.run.replayed", data__replay_id=str(replay.id)).exists()
