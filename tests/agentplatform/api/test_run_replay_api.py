"""POST /api/runs/<id>/replay/: 202 with the replay; its report; scoped; problems."""

from __future__ import annotations

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run
from runs.replay.reproduce import replay_execute
from runs.services import task_submit
from tests.factories import api_client_for, member_with_repository

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def test_a_member_replays_a_finished_run_and_reads_the_report(sample_repo):
    user, workspace, repository = member_with_repository()
    repository.clone_url = str(sample_repo)
    repository.save()
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    api = api_client_for(user)

    active = api.post(f"/api/runs/{submission.run.id}/replay/")
    assert active.status_code == 409 and active["content-type"] == "application/problem+json"

    run = run_drive_inline(run_id=submission.run.id)
    accepted = api.post(f"/api/runs/{run.id}/replay/")
    assert accepted.status_code == 202, accepted.content
    replay_execute(replay_id=accepted.json()["id"])
    report = api.get(accepted["Location"])
    assert report.status_code == 200
    assert report.json()["status"] == "reproduced"
    assert report.json()["report"]["patch_sha256"] == run.patches.get().diff_sha256

    stranger, _, _ = member_with_repository()
    assert api_client_for(stranger).post(f"/api/runs/{run.id}/replay/").status_code == 404
    assert api_client_for(stranger).get(accepted["Location"]).status_code == 404


def test_a_member_forks_a_finished_run_and_a_bad_turn_is_a_problem(sample_repo):
    user, workspace, repository = member_with_repository()
    repository.clone_url = str(sample_repo)
    repository.save()
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)
    api = api_client_for(user)

    accepted = api.post(f"/api/runs/{run.id}/fork/", {"turn": 1}, format="json")
    assert accepted.status_code == 202, accepted.content
    fork = Run.objects.get(pk=accepted.json()["run_id"])
    assert fork.task.source_ref["fork_of"]["run_id"] == str(run.id)

    too_far = api.post(f"/api/runs/{run.id}/fork/", {"turn": 99}, format="json")
    assert too_far.status_code == 409 and too_far.json()["code"] == "turn_out_of_range"
    unknown = api.post(f"/api/runs/{run.id}/fork/", {"turn": 1, "extra": 1}, format="json")
    assert unknown.status_code == 400
