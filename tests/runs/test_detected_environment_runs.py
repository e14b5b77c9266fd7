"""Ordinary repositories registered with repository_add's defaults pass verification: the
test command and the setup installing their test dependencies are detected, the setup
downloads (network only there) into the sandbox, and the tests run with what it made."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from runs.engine import run_drive_inline
from runs.models import Repository, Run
from runs.services import task_submit
from tests.runs.ordinary_repositories import (
    NODE_FIX,
    PYTEST_FIX,
    node_repository_create,
    pytest_repository_create,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _added(workspace, clone_url: Path) -> Repository:
    out = io.StringIO()
    call_command(
        "repository_add",
        *("--workspace", workspace.slug, "--name", "mine", "--clone-url", str(clone_url)),
        stdout=out,
    )
    return Repository.objects.get(pk=int(out.getvalue().strip().splitlines()[-1]))


def _drive(workspace, repository, script) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix the failing test",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": script},
    )
    return run_drive_inline(run_id=submission.run.id)


@pytest.mark.parametrize(
    ("create", "script", "kind", "test_command", "installs"),
    [
        (
            pytest_repository_create,
            PYTEST_FIX,
            "python-pytest",
            ".venv/bin/python -m pytest -q",
            "-e '.[test]' pytest",
        ),
        (node_repository_create, NODE_FIX, "node", "npm test", "npm install"),
    ],
)
def test_a_repository_with_the_defaults_passes_verification(
    workspace, tmp_path, create, script, kind, test_command, installs
):
    repository = _added(workspace, create(tmp_path / "origin"))
    assert (repository.test_command, repository.setup_command) == ("", "")

    run = _drive(workspace, repository, script)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    detected = run.events.get(type="agent.environment.detected").data
    assert (detected["kind"], detected["test_command"]) == (kind, test_command)
    assert installs in detected["setup_command"]
    setup = run.events.get(type="agent.setup.completed").data
    assert setup["network"] is True and setup["cached"] is False
    verification = run.verifications.get()
    assert (verification.outcome, verification.command) == ("passed", test_command)
    # The patch is the fix alone: nothing the setup or the test runs left behind.
    fixed = script["turns"][1]["tool_calls"][0]["arguments"]["path"]
    assert run.patches.get().files_changed == [fixed]
    # The agent's run_tests uses the detected command too.
    run_tests = run.tool_calls.get(tool="run_tests")
    assert run_tests.result["exit_code"] == 0, run_tests.result

    # The next run of the repository reuses the environment the first one made.
    again = _drive(workspace, repository, script)
    assert again.status == Run.Status.COMPLETED, (again.failure_reason, again.failure_detail)
    assert again.events.get(type="agent.setup.completed").data["cached"] is True
