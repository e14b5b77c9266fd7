"""An environment that cannot run the tests (a command or the test runner missing, a setup
that fails, nothing to tell how the tests run) ends the run with the environment's
reason, its output on the timeline, quickly and without spending the agent's attempts."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from runs import demo
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Patch, Repository, Run
from runs.services import task_submit
from tests.runs.ordinary_repositories import PYTEST_FIX, pytest_repository_create

pytestmark = pytest.mark.django_db(transaction=True)


def _added(workspace, clone_url, *extra: str) -> Repository:
    """A repository registered as the README does, with repository_add's defaults."""
    out = io.StringIO()
    call_command(
        "repository_add",
        "--workspace",
        workspace.slug,
        "--name",
        "mine",
        "--clone-url",
        str(clone_url),
        *extra,
        stdout=out,
    )
    return Repository.objects.get(pk=int(out.getvalue().strip().splitlines()[-1]))


def _drive(workspace, repository, script=None) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix the failing test",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": script or demo.fix_script()},
    )
    return run_drive_inline(run_id=submission.run.id)


def _environment_event(run: Run) -> dict:
    return run.events.get(type="agent.environment.failed").data


@pytest.mark.parametrize(
    ("test_command", "said"),
    [
        # repository_add's old default: no `python` in the sandbox, and no pytest.
        ("python -m pytest -q", "python: not found"),
        ("python3 -m pytest -q", "No module named pytest"),
    ],
)
def test_a_test_command_the_sandbox_cannot_run_ends_before_the_agent_starts(
    workspace, sample_repo, test_command, said
):
    repository = _added(workspace, sample_repo, "--test-command", test_command)
    started = time.monotonic()

    run = _drive(workspace, repository)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "environment_error")
    assert run.failure_reason != "budget_agent_attempts"
    assert said in run.failure_detail and test_command in run.failure_detail
    event = _environment_event(run)
    assert event["stage"] == "preflight" and said in event["output_tail"]
    # Nothing of the agent's was spent on it, and it ended at once.
    assert not ModelTurn.objects.filter(run=run).exists()
    assert not Patch.objects.filter(run=run).exists()
    assert time.monotonic() - started < 30


def test_a_command_missing_when_the_tests_run_is_the_environments_not_the_patchs(
    workspace, sample_repo
):
    # The first program is there (the preflight passes); the suite then calls one that
    # is not, as a test script calling an uninstalled tool does.
    repository = _added(
        workspace, sample_repo, "--test-command", "python3 -c pass && no-such-test-runner -q"
    )

    run = _drive(workspace, repository)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "environment_error")
    assert "exit code 127" in run.failure_detail
    assert "no-such-test-runner: not found" in run.failure_detail
    event = _environment_event(run)
    assert event["stage"] == "verification"
    assert "no-such-test-runner: not found" in event["output_tail"]
    # One patch, verified once: no feedback round, no second attempt.
    assert Patch.objects.filter(run=run).count() == 1
    assert not run.events.filter(type="agent.feedback.sent").exists()
    assert run.verifications.count() == 0


def test_a_failing_setup_ends_setup_failed_with_its_output(workspace, tmp_path):
    bare = pytest_repository_create(tmp_path / "origin")
    # The detected setup installs pytest from the package index; this repository's
    # policy gives its setup no network.
    repository = _added(workspace, bare, "--no-setup-network")

    run = _drive(workspace, repository, PYTEST_FIX)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "setup_failed")
    event = _environment_event(run)
    assert event["stage"] == "setup" and "pip install" in event["command"]
    assert "no network" in run.failure_detail
    assert event["output_tail"] and event["output_tail"].strip()[-200:] in run.failure_detail
    assert not ModelTurn.objects.filter(run=run).exists()


def test_a_repository_that_says_nothing_about_its_tests_asks_for_a_test_command(
    workspace, tmp_path
):
    bare = demo.sample_repository_create(tmp_path / "origin", {"README.md": "notes\n"})
    repository = _added(workspace, bare)

    run = _drive(workspace, repository)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "environment_error")
    assert "test_command" in run.failure_detail
    assert _environment_event(run)["stage"] == "detection"
