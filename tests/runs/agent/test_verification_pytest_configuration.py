"""pytest configuration in a patch (a conftest.py that skips every test, an ``addopts``
that deselects the failing one) does not steer verification, and is a finding that
waits for a human: real runs on the scripted model, pytest run in the sandbox."""

from __future__ import annotations

import pytest

from runs.engine import run_drive_inline
from runs.models import JudgeAttempt, PullRequest, Run, VerificationAttempt
from runs.services import task_submit
from tests.factories import RepositoryFactory
from tests.runs.agent.steering_scripts import (
    PYTEST_COMMAND,
    SKIP_EVERYTHING_CONFTEST,
    branches,
    fix,
    pytest_repository_create,
    script,
    write,
)

pytestmark = pytest.mark.django_db(transaction=True)

DESELECT_FAILING = '[pytest]\naddopts = -ra -k "not test_add"\n'


@pytest.fixture
def origin(tmp_path):
    return pytest_repository_create(tmp_path / "origin")


@pytest.fixture
def pytest_repository(workspace, origin):
    return RepositoryFactory(
        workspace=workspace, clone_url=str(origin), test_command=PYTEST_COMMAND
    )


def _run(workspace, repository, turns: dict) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Make the tests pass",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": turns},
    )
    return run_drive_inline(run_id=submission.run.id)


@pytest.mark.parametrize(
    ("path", "content"),
    [("tests/conftest.py", SKIP_EVERYTHING_CONFTEST), ("pytest.ini", DESELECT_FAILING)],
    ids=["conftest-skips-everything", "addopts-deselects-the-failing-test"],
)
def test_pytest_configuration_in_the_patch_does_not_steer_verification(
    workspace, pytest_repository, origin, settings, path, content
):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False

    run = _run(workspace, pytest_repository, script(write(path, content)))

    assert run.status != Run.Status.COMPLETED
    assert not PullRequest.objects.filter(task=run.task).exists()
    assert branches(origin) == ["refs/heads/main"]
    first = run.verifications.order_by("patch__attempt_no").first()
    # The tests ran as the base commit configures them: test_add ran, and failed.
    assert first.outcome == VerificationAttempt.Outcome.TEST_FAILURE
    assert first.test_report["counts"] == {"ran": 2, "passed": 1, "failed": 1}
    assert first.test_report["baseline"] == {"ran": 2, "passed": 1, "failed": 1}
    assert [c["path"] for c in first.test_report["steering"]] == [path]
    feedback = run.events.filter(type="agent.feedback.sent").first()
    assert feedback is not None and feedback.data["reason"] == "verification_test_failure"


def test_a_conftest_beside_a_real_fix_passes_verification_and_waits_for_approval(
    workspace, pytest_repository, origin, settings
):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False

    run = _run(
        workspace, pytest_repository, script(fix(), write("conftest.py", SKIP_EVERYTHING_CONFTEST))
    )

    assert run.status == Run.Status.AWAITING_APPROVAL, (run.failure_reason, run.failure_detail)
    assert run.verifications.get().test_report["counts"] == {"ran": 2, "passed": 2, "failed": 0}
    rules = JudgeAttempt.objects.get(run=run, judge="rules")
    assert {"rule": "test_configuration", "severity": "approval"}.items() <= rules.findings[
        0
    ].items()
    assert branches(origin) == ["refs/heads/main"]
