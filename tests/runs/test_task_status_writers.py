"""A Task's status is written by ``runs`` services only (docs/design.md §1, principle 5).

Read with ``ast``: any ``<x>.status = ...`` / ``<x>.status_reason = ...`` assignment on a
task, and any ``Task.objects....update(status=...)`` (or ``create``/``get_or_create`` with
a status), outside the modules allowed to write it. Webhooks, the API and the admin
call a service instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_services

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentplatform", "runs", "jobs", "webhooks")
# The services, and the run's end, whose transaction writes its task's closing status.
ALLOWED = ("runs/services/", "runs/ending.py")
FIELDS = {"status", "status_reason"}
WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}


def _names_task(node: ast.AST) -> bool:
    """Whether an expression reads like a task: ``task``, ``x.task``, ``Task.objects...``."""
    text = ast.unparse(node)
    head = text.split("(")[0]
    return (
        head == "Task" or head.startswith("Task.") or text.split(".")[-1] in {"task", "locked_task"}
    )


def _task_queryset(node: ast.AST) -> bool:
    while isinstance(node, ast.Call | ast.Attribute):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id == "Task"


def task_status_writes(path: Path) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr in FIELDS
                    and _names_task(target.value)
                ):
                    found.append((node.lineno, f"{ast.unparse(target)} = ..."))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and _task_queryset(node.func.value)
            and any(keyword.arg in FIELDS for keyword in node.keywords)
        ):
            found.append((node.lineno, f"{ast.unparse(node.func)}(status=...)"))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_only_runs_services_write_a_tasks_status() -> None:
    offending = []
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" in relative or relative.startswith(ALLOWED):
            continue
        offending += [f"{relative}:{line}" for line in task_status_writes(path)]
    assert offending == []


def test_the_services_do_write_it() -> None:
    """The check finds the writes where they are (it can fail)."""
    services = sorted((ROOT / "runs" / "services").glob("*.py"))
    assert sum(len(task_status_writes(path)) for path in services) >= 3
    assert task_status_writes(ROOT / "runs" / "ending.py")


def test_the_checker_sees_assignments_and_updates(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f(task, run):\n"
        "    task.status = 'failed'\n"
        "    run.status = 'failed'\n"
        "    Task.objects.filter(pk=1).update(status='completed')\n"
        "    Task.objects.filter(pk=1).update(pending_feedback='')\n"
        "    run.task.status_reason = 'x'\n"
    )
    assert task_status_writes(module) == [
        "2: task.status = ...",
        "4: Task.objects.filter(pk=1).update(status=...)",
        "6: run.task.status_reason = ...",
    ]
