"""The judge flags a patch that weakens tests (tests_modified), and by policy such a
patch waits for a human even in autonomous mode."""

from __future__ import annotations

import pytest

from runs.agent.judge import judge_rules, weakened_tests
from runs.engine import run_drive_inline
from runs.models import Approval, JudgeAttempt, Run
from runs.services import task_submit

EDIT_TEST = """diff --git a/tests/test_core.py b/tests/test_core.py
index 1111111..2222222 100644
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -7,2 +7,2 @@ class CoreTest(unittest.TestCase):
     def test_add(self):
-        self.assertEqual(add(2, 3), 5)
+        pass
"""
DELETE_TEST = """diff --git a/pkg/foo_test.go b/pkg/foo_test.go
deleted file mode 100644
index 1111111..0000000
--- a/pkg/foo_test.go
+++ /dev/null
@@ -1 +0,0 @@
-package pkg
"""
ASSERT_IN_CODE = """diff --git a/calc/core.py b/calc/core.py
index 1111111..2222222 100644
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,3 +1,2 @@
 def add(a, b):
-    assert isinstance(a, int)
     return a + b
"""
NEW_TEST = """diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
index 0000000..2222222
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1,2 @@
+def test_new():
+    assert True
"""
CODE_ONLY = """diff --git a/calc/core.py b/calc/core.py
index 1111111..2222222 100644
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


@pytest.mark.no_services
@pytest.mark.parametrize(
    ("diff", "paths", "removed"),
    [(EDIT_TEST, ["tests/test_core.py"], 1), (DELETE_TEST, ["pkg/foo_test.go"], 0)],
)
def test_editing_or_deleting_tests_is_flagged(diff, paths, removed):
    finding = weakened_tests(diff)
    assert finding == {
        "rule": "tests_modified",
        "severity": "flag",
        "paths": paths,
        "removed_assertions": removed,
    }
    verdict = judge_rules(diff_text=diff, files=paths, lines_changed=2, forbidden_paths=[])
    assert verdict.verdict == "accept" and finding in verdict.findings


@pytest.mark.no_services
def test_a_removed_assertion_in_code_is_flagged_and_new_tests_or_code_are_not():
    assert weakened_tests(ASSERT_IN_CODE)["removed_assertions"] == 1
    assert weakened_tests(NEW_TEST) is None
    assert weakened_tests(CODE_ONLY) is None


def _weakening_script() -> dict:
    return {
        "turns": [
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": {
                            "path": "tests/test_core.py",
                            # Both tests stay (fewer tests than the base is a
                            # verification failure); one no longer asserts anything.
                            "content": "import unittest\n\n\nclass CoreTest(unittest.TestCase):\n"
                            "    def test_add(self):\n        pass\n\n"
                            "    def test_multiply(self):\n        pass\n",
                        },
                    }
                ]
            },
            {"tool_calls": [{"name": "finish", "arguments": {"summary": "tests pass now"}}]},
        ]
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("required", [True, False])
def test_weakened_tests_need_approval_by_policy(workspace, repository, settings, required):
    settings.TESTS_MODIFIED_REQUIRES_APPROVAL = required
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Make the tests pass",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": _weakening_script()},
    )

    run = run_drive_inline(run_id=submission.run.id)

    rules = JudgeAttempt.objects.get(run=run, judge="rules")
    assert any(f["rule"] == "tests_modified" for f in rules.findings)
    if required:
        assert run.status == Run.Status.AWAITING_APPROVAL
        requested = run.events.get(type="agent.approval.requested")
        assert requested.data["reason"] == "tests_modified"
        assert Approval.objects.filter(run=run, status=Approval.Status.PENDING).exists()
    else:
        assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
