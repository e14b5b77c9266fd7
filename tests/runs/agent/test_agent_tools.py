"""The agent's tools on a real repository of this size: this project's own clone."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runs.agent.context import clip, context_condense, messages_tokens
from runs.agent.sandbox import LocalSandbox
from runs.agent.tool_policy import command_check
from runs.agent.tools import Toolbox, ToolDenied, ToolPolicy

pytestmark = pytest.mark.no_services

PROJECT = Path(__file__).resolve().parents[3]


@pytest.fixture
def own_clone(tmp_path_factory, settings):
    settings.SANDBOX_ROOT = str(tmp_path_factory.mktemp("sandboxes"))
    sandbox = LocalSandbox("own-clone")
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(PROJECT), str(sandbox.path)],
        check=True,
    )
    # What made search slow and listings useless: an ignored virtualenv full of files.
    venv = sandbox.path / ".venv" / "lib"
    venv.mkdir(parents=True)
    for n in range(3000):
        (venv / f"mod{n}.py").write_text("def step_running():\n    pass\n")
    return sandbox


def _toolbox(sandbox: LocalSandbox, **kwargs) -> Toolbox:
    policy = ToolPolicy(
        forbidden_paths=[".github/**", ".env*"],
        allowed_commands=["python3", "python", "pytest", "grep", "ls", "git"],
    )
    return Toolbox(sandbox, policy, **kwargs)


def test_repo_map_ranks_the_code_the_task_is_about(own_clone):
    toolbox = _toolbox(own_clone, focus="The step_running handler loses tool output")

    result = toolbox.execute("repo_map", {})

    text = result.output
    assert result.status == "completed"
    head = text.split("Other files:")[0]
    assert "runs/steps/running.py:" in head
    assert "def step_running(ctx: StepContext) -> Outcome:" in head
    assert ".venv" not in text
    assert len(text) < 20_000


def test_search_respects_gitignore_and_is_fast(own_clone):
    toolbox = _toolbox(own_clone)
    toolbox.execute("search", {"pattern": "warm up"})  # first git call warms the index

    started = time.perf_counter()
    result = toolbox.execute("search", {"pattern": r"def step_running\("})
    elapsed = time.perf_counter() - started

    assert result.output.splitlines() == [
        line for line in result.output.splitlines() if not line.startswith(".venv")
    ]
    assert "runs/steps/running.py:" in result.output
    assert 1 <= result.data["hits"] < 10  # the 3000 ignored copies are not searched
    # Reported rather than asserted (timing belongs to bench/); 0.5 s is the target.
    print(f"search on the project's own clone: {elapsed * 1000:.0f} ms")
    quoted = toolbox.execute("search", {"pattern": "a|b", "fixed_string": True, "path": "runs"})
    assert quoted.status == "completed"


def test_list_files_leaves_ignored_files_out(own_clone):
    result = _toolbox(own_clone).execute("list_files", {"path": "."})

    assert "runs/steps/running.py" in result.output
    assert ".venv" not in result.output
    assert result.data["count"] < 1000


def test_read_file_shows_windows_with_line_numbers_and_markers(own_clone):
    toolbox = _toolbox(own_clone)
    total = len((own_clone.path / "runs/agent/tools.py").read_text().splitlines())

    first = toolbox.execute("read_file", {"path": "runs/agent/tools.py"})
    window = toolbox.execute(
        "read_file", {"path": "runs/agent/tools.py", "start_line": 250, "end_line": 260}
    )

    assert first.output.startswith(f"[runs/agent/tools.py: {total} lines; showing 1-200]")
    assert f"[... lines 201-{total} below; read_file with start_line=201" in first.output
    assert "   200\t" in first.output and "   201\t" not in first.output
    assert "[... lines 1-249 above ...]" in window.output
    assert "   250\t" in window.output and "   261\t" not in window.output


def test_edit_fails_clearly_on_zero_or_many_matches_and_refuses_syntax_errors(own_clone):
    toolbox = _toolbox(own_clone)
    path = "runs/agent/budget.py"
    before = (own_clone.path / path).read_text()

    missing = toolbox.execute("replace_text", {"path": path, "old": "no such", "new": "x"})
    many = toolbox.execute("replace_text", {"path": path, "old": "budget", "new": "x"})
    broken = toolbox.execute(
        "replace_text", {"path": path, "old": "def budget_used(", "new": "def budget_used(("}
    )

    assert "not found" in missing.output and missing.data["applied"] is False
    assert "occurs" in many.output and "lines" in many.output
    assert "NOT applied" in broken.output and "SyntaxError" in broken.output
    assert (own_clone.path / path).read_text() == before


def test_edit_insert_and_undo(own_clone):
    toolbox = _toolbox(own_clone)
    path = "runs/agent/verify.py"
    original = (own_clone.path / path).read_text()

    edit = toolbox.execute(
        "replace_text",
        {"path": path, "old": "def verification_classify(", "new": "def verification_sort("},
    )
    insert = toolbox.execute("insert", {"path": path, "line": 0, "text": "# header"})
    edited = (own_clone.path / path).read_text()
    toolbox.execute("undo_edit", {"path": path})
    after_one = (own_clone.path / path).read_text()
    toolbox.execute("undo_edit", {"path": path})

    assert edit.data["applied"] and "def verification_sort(" in edit.output
    assert insert.data["applied"] and edited.startswith("# header\n")
    assert not after_one.startswith("# header") and "verification_sort" in after_one
    assert (own_clone.path / path).read_text() == original
    assert "no edit" in toolbox.execute("undo_edit", {"path": path}).output


def test_command_policy_parses_the_command_line():
    allowed = ["python", "pytest", "grep", "git"]

    assert command_check('grep -rn "a|b" runs', allowed) == ["grep"]
    assert command_check("pytest -q 2>&1", allowed) == ["pytest"]
    assert command_check("cd runs && pytest -x", allowed) == ["cd", "pytest"]
    assert command_check("git log | grep fix", allowed) == ["git", "grep"]
    for denied in ("rm -rf /", "pytest; curl evil", "echo $(id)", "pytest | sh", "ls `id`"):
        with pytest.raises(ToolDenied):
            command_check(denied, allowed)


def test_run_command_with_cwd_and_non_zero_exit_is_information(own_clone):
    toolbox = _toolbox(own_clone)

    here = toolbox.execute(
        "run_command",
        {"command": "python3 -c 'import os; print(os.getcwd())'", "cwd": "runs"},
    )
    failing = toolbox.execute("run_command", {"command": "grep -q no-such-text-anywhere README.md"})

    assert here.status == "completed" and here.output.strip().endswith("/runs")
    assert failing.status == "completed" and failing.data["exit_code"] == 1


def test_clip_marks_what_it_left_out():
    text = "\n".join(f"line {n}" for n in range(1, 2001))

    clipped = clip(text, max_lines=100)

    assert "line 1\n" in clipped and clipped.endswith("line 2000")
    assert "[... 1900 lines" in clipped and "clipped: lines 67-1966 of 2000" in clipped


def test_condensation_keeps_a_300_turn_conversation_under_the_window():
    window = 32_768
    budget = int(window * 0.7) - 4096
    messages = [
        {"role": "system", "content": "rules " * 200},
        {"role": "user", "content": "Task: fix add()"},
        {"role": "assistant", "content": "Plan: read, fix, test"},
    ]
    sizes = []
    for turn in range(300):
        messages = context_condense(messages, budget)
        sizes.append(messages_tokens(messages))
        name = ["read_file", "search", "replace_text", "run_tests"][turn % 4]
        call_id = f"c{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": f"turn {turn}",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": '{"path": "x.py"}'},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": f"{name} output\n" + "x" * 3000}
        )

    assert max(sizes) <= budget
    assert (
        messages[0]["content"].startswith("rules") and messages[1]["content"] == "Task: fix add()"
    )
    assert messages[2]["content"].startswith("Plan:")
    # Every tool result still follows the call that asked for it.
    ids = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            ids.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in ids
    # Condensing is deterministic: the same history condenses to the same messages.
    assert context_condense(messages, budget) == context_condense(messages, budget)


def test_the_str_replace_editor_that_trained_models_call(own_clone):
    toolbox = _toolbox(own_clone)
    path = "runs/agent/verify.py"

    view = toolbox.execute(
        "str_replace_editor", {"command": "view", "path": path, "view_range": [3, -1]}
    )
    edit = toolbox.execute(
        "str_replace_editor",
        {
            "command": "str_replace",
            "path": path,
            "old_str": "def verification_classify(",
            "new_str": "def verification_sort(",
        },
    )
    undo = toolbox.execute("str_replace_editor", {"command": "undo_edit", "path": path})
    created = toolbox.execute(
        "str_replace_editor", {"command": "create", "path": "notes/new.py", "file_text": "x = 1\n"}
    )

    assert "[... lines 1-2 above ...]" in view.output and "     3\t" in view.output
    assert edit.data["applied"] and "restored" in undo.output
    assert "def verification_classify(" in (own_clone.path / path).read_text()
    assert (own_clone.path / "notes/new.py").read_text() == "x = 1\n" and "wrote" in created.output
    with pytest.raises(ToolDenied):
        toolbox.check(
            "str_replace_editor",
            {"command": "create", "path": ".github/workflows/x.yml", "file_text": "x"},
        )
    toolbox.check("str_replace_editor", {"command": "view", "path": ".github/workflows/x.yml"})
