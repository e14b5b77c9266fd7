"""A fix that only weakens the tests goes back to the model, not to a human; the commit
the platform makes is named after the model's own summary of its change."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from runs.agent import judge
from runs.engine import run_drive_inline
from runs.models import Approval, JudgeAttempt, Run
from runs.services import task_submit
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer, completion

pytestmark = pytest.mark.django_db(transaction=True)

# The failing assertion goes; the test still runs (and passes), so only the judge can
# tell that nothing was fixed.
ASSERTION = "        self.assertEqual(add(2, 3), 5)"
WEAKEN = {"path": "tests/test_core.py", "old": ASSERTION, "new": "        pass  # flaky"}
RESTORE = {"path": "tests/test_core.py", "old": "        pass  # flaky", "new": ASSERTION}
FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}
SUMMARY = "add() returns the sum of its arguments\n\nIt subtracted them."


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def cheating_then_fixing(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
    if not body.get("tools"):
        return 200, {}, completion("1. Make the tests pass.")
    messages = body["messages"]
    feedback = next(
        (m for m in reversed(messages) if "A reviewer asks for changes" in str(m["content"])),
        None,
    )
    last = messages[-1]
    if feedback is None:
        if last["role"] == "tool" and last["tool_call_id"] == "weaken":
            done = {"summary": "make the flaky test pass"}
            return 200, {}, completion("", [{"id": "f1", "name": "finish", "arguments": done}])
        weaken = {"id": "weaken", "name": "replace_text", "arguments": WEAKEN}
        return 200, {}, completion("", [weaken])
    if last is feedback:
        calls = [
            {"id": "restore", "name": "replace_text", "arguments": RESTORE},
            {"id": "fix", "name": "replace_text", "arguments": FIX},
        ]
        return 200, {}, completion("Fixing the code instead.", calls)
    done = {"summary": SUMMARY}
    return 200, {}, completion("", [{"id": "f2", "name": "finish", "arguments": done}])


def test_a_patch_that_only_removes_the_failing_assertion_goes_back_to_the_model(
    workspace, repository, sample_repo, settings
):
    with ChatCompletionsServer(cheating_then_fixing) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "cheater": {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url},
        }
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add(): the test for it fails",
            model_options={"profile": "cheater"},
            execution_mode="autonomous_pr",
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    first, second = run.patches.order_by("attempt_no")
    judged = JudgeAttempt.objects.get(patch=first, judge="rules")
    assert judged.verdict == "revise"
    finding = next(f for f in judged.findings if f["rule"] == "tests_weakened")
    assert finding["removed_assertions"] == 1 and finding["paths"] == ["tests/test_core.py"]
    # Before any human saw it: no approval was asked for the weakened patch.
    assert not Approval.objects.filter(patch=first).exists()
    told = [m for r in server.requests for m in r["messages"] if "hidden, not fixed" in str(m)]
    assert told, "the model was not told why"
    assert run.events.filter(type="agent.feedback.sent", data__reason="judge_revise").exists()
    assert second.files_changed == ["calc/core.py"]
    # The commit and the pull request carry the model's summary, not the instruction.
    pull = run.task.pull_requests.get()
    assert pull.title == "agent: add() returns the sum of its arguments"
    message = subprocess.run(
        ["git", "--git-dir", str(sample_repo), "log", "-1", "--format=%B", run.branch],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert message.startswith("agent: add() returns the sum of its arguments\n\nIt subtracted")
    assert "Task: Fix add(): the test for it fails" in message


JS_SKIP = """diff --git a/src/cart.test.js b/src/cart.test.js
--- a/src/cart.test.js
+++ b/src/cart.test.js
@@ -1,5 +1,5 @@
-test('adds', () => {
+test.skip('adds', () => {
   expect(add(1, 2)).toBe(3);
 });
"""
GO_ASSERT_REMOVED = """diff --git a/calc_test.go b/calc_test.go
--- a/calc_test.go
+++ b/calc_test.go
@@ -3,6 +3,4 @@ func TestAdd(t *testing.T) {
     got := Add(1, 2)
-    if got != 3 {
-        t.Errorf("got %d", got)
-    }
+    _ = got
 }
"""
PY_DELETED = """diff --git a/tests/test_core.py b/tests/test_core.py
deleted file mode 100644
--- a/tests/test_core.py
+++ /dev/null
@@ -1,3 +0,0 @@
-def test_add():
-    assert add(2, 3) == 5
"""
CODE_AND_TEST = """diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,2 +1,2 @@
-    return a - b
+    return a + b
diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1,2 +1,2 @@
-    assert add(2, 3) == 5
+    assert add(2, 3) == 5, "sum"
"""
STRONGER_TEST = """diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1,2 +1,3 @@
 def test_add():
     assert add(2, 3) == 5
+    assert add(-1, 1) == 0
"""


@pytest.mark.parametrize("diff", [JS_SKIP, GO_ASSERT_REMOVED, PY_DELETED])
def test_weakening_only_tests_is_found_in_any_language(diff):
    assert judge.tests_weakened_only(diff)["rule"] == "tests_weakened"


@pytest.mark.parametrize("diff", [CODE_AND_TEST, STRONGER_TEST])
def test_a_code_change_or_a_stronger_test_is_not_weakening(diff):
    assert judge.tests_weakened_only(diff) is None


def test_only_a_task_that_asks_for_a_fix_is_held_to_it():
    assert judge.task_asks_for_fix(instruction="Fix the crash in parse()")
    assert judge.task_asks_for_fix(instruction="Make it faster", task_type="bugfix")
    assert not judge.task_asks_for_fix(instruction="Remove the obsolete tests for v1")
    assert not judge.task_asks_for_fix(instruction="Fix CI: skip the flaky network test")
    assert not judge.task_asks_for_fix(instruction="Rename LegacyClock to Clock")
