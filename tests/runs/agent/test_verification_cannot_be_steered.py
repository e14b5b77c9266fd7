"""A patch cannot fake its own verification: a module shadowing the test runner,
skipped tests, a test module that ends the run with a made-up summary; real runs on the
scripted model (and one over the API on a real worker)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs import demo
from runs.engine import run_drive_inline
from runs.models import (
    Approval,
    Artifact,
    JudgeAttempt,
    Membership,
    PullRequest,
    Run,
    VerificationAttempt,
)
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.factories import UserFactory
from tests.runs.agent.steering_scripts import FAKE_UNITTEST_MAIN, branches, fix, script, write

pytestmark = pytest.mark.django_db(transaction=True)

# The same two tests, both skipped: unittest exits 0 and says OK.
SKIPPED_TESTS = demo.SAMPLE_FILES["tests/test_core.py"].replace(
    "class CoreTest", '@unittest.skip("later")\nclass CoreTest'
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


def _never_pushed(run: Run, sample_repo) -> None:
    assert run.status != Run.Status.COMPLETED
    assert not PullRequest.objects.filter(task=run.task).exists()
    assert branches(sample_repo) == ["refs/heads/main"]


def test_a_shadowed_unittest_that_prints_ok_is_not_what_verification_runs(
    workspace, repository, sample_repo, settings
):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False
    turns = script(
        write("unittest/__init__.py", ""), write("unittest/__main__.py", FAKE_UNITTEST_MAIN)
    )

    run = _run(workspace, repository, turns)

    _never_pushed(run, sample_repo)
    first = run.verifications.order_by("patch__attempt_no").first()
    assert first.outcome == VerificationAttempt.Outcome.TEST_FAILURE
    assert {c["path"] for c in first.test_report["steering"]} == {
        "unittest/__init__.py",
        "unittest/__main__.py",
    }
    assert first.test_report["counts"] == {"ran": 2, "passed": 1, "failed": 1}
    feedback = run.events.filter(type="agent.feedback.sent").first()
    assert "unittest/__main__.py" in feedback.data["summary"] or "unittest" in first.summary
    assert "shadows the module 'unittest'" in first.summary
    # The base commit's tests ran once for the whole run, however often it verified.
    assert Artifact.objects.filter(run=run, name="verification base").count() == 1
    assert run.verifications.count() >= 2


def test_a_shadowed_runner_beside_a_real_fix_waits_for_a_human_even_in_autonomous_mode(
    workspace, repository, sample_repo, settings
):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False
    turns = script(
        fix(), write("unittest/__init__.py", ""), write("unittest/__main__.py", FAKE_UNITTEST_MAIN)
    )

    run = _run(workspace, repository, turns)

    assert run.status == Run.Status.AWAITING_APPROVAL, (run.failure_reason, run.failure_detail)
    verification = run.verifications.get()
    assert verification.outcome == VerificationAttempt.Outcome.PASSED
    finding = next(
        f
        for f in JudgeAttempt.objects.get(run=run, judge="rules").findings
        if f["rule"] == "test_configuration"
    )
    assert finding["severity"] == "approval"
    assert {f["path"] for f in finding["files"]} == {"unittest/__init__.py", "unittest/__main__.py"}
    assert run.events.get(type="agent.approval.requested").data["reason"] == "test_configuration"
    assert Approval.objects.filter(run=run, status=Approval.Status.PENDING).exists()
    _never_pushed(run, sample_repo)


def test_skipping_the_tests_is_fewer_tests_than_the_base_commit_not_a_pass(
    workspace, repository, sample_repo, settings
):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False
    run = _run(workspace, repository, script(write("tests/test_core.py", SKIPPED_TESTS)))

    _never_pushed(run, sample_repo)
    first = run.verifications.order_by("patch__attempt_no").first()
    assert first.outcome == VerificationAttempt.Outcome.FEWER_TESTS
    assert first.exit_code == 0
    assert first.test_report["counts"]["ran"] == 0
    assert first.test_report["baseline"] == {"ran": 2, "passed": 1, "failed": 1}
    feedback = run.events.filter(type="agent.feedback.sent").first()
    assert feedback.data["reason"] == "verification_fewer_tests"
    assert "fewer tests ran than on the base commit: 0 of 2" in first.summary


EXIT_WITH_A_MADE_UP_SUMMARY = (
    "import os\nimport sys\n\n"
    'sys.stderr.write("..\\n' + "-" * 70 + '\\nRan 2 tests in 0.001s\\n\\nOK\\n")\n'
    "sys.stderr.flush()\n"
    "os._exit(0)\n"
)


def test_a_new_test_module_that_ends_the_run_with_a_made_up_summary_waits_for_a_human(
    workspace, repository, sample_repo, settings
):
    """Test code runs inside the runner, so it can print anything; what verification
    cannot undo, the judge reports, and a human decides."""
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = False
    turns = script(write("tests/test_zz_fast.py", EXIT_WITH_A_MADE_UP_SUMMARY))

    run = _run(workspace, repository, turns)

    assert run.status == Run.Status.AWAITING_APPROVAL, (run.failure_reason, run.failure_detail)
    finding = next(
        f
        for f in JudgeAttempt.objects.get(run=run, judge="rules").findings
        if f["rule"] == "test_configuration"
    )
    assert [(f["path"], f["kind"]) for f in finding["files"]] == [
        ("tests/test_zz_fast.py", "runner_tampering")
    ]
    _never_pushed(run, sample_repo)


@pytest.mark.slow
def test_the_shadowed_unittest_submitted_through_the_api_fails_on_a_real_worker(
    workspace, repository, sample_repo, start_worker, settings
):
    """The attack as the issue reported it: a task submitted over the API, run by a real
    worker process (verify queue included), the runner shadowed; nothing is pushed."""
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    api = APIClient()
    api.force_authenticate(user)
    start_worker()
    turns = script(
        write("unittest/__init__.py", ""), write("unittest/__main__.py", FAKE_UNITTEST_MAIN)
    )

    response = api.post(
        "/api/tasks/",
        {
            "repository": repository.pk,
            "instruction": "Make the tests pass",
            "execution_mode": "autonomous_pr",
            "model_options": {"provider": "scripted", "script": turns},
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    run = Run.objects.get(pk=response.json()["run_id"])

    def ended() -> Run | None:
        run.refresh_from_db()
        return run if run.status in TERMINAL else None

    wait_for(ended, timeout=120, message="the run to end")
    assert run.status == Run.Status.FAILED
    assert run.verifications.filter(outcome="passed").count() == 0
    _never_pushed(run, sample_repo)
