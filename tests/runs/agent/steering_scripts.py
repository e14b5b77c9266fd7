"""Scripted agents that try to make verification pass without fixing the code, and the
repositories they try it on."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from runs import demo

FAKE_UNITTEST_MAIN = (
    'import sys\nsys.stderr.write("..\\n' + "-" * 70 + '\\nRan 2 tests in 0.001s\\n\\nOK\\n")\n'
)
SKIP_EVERYTHING_CONFTEST = (
    "import pytest\n\n\n"
    "def pytest_collection_modifyitems(items):\n"
    "    for item in items:\n"
    '        item.add_marker(pytest.mark.skip(reason="later"))\n'
)
FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}
# pytest from the platform's own environment, committed into the test repository: the
# sandbox sees only the system's Python, which has no pytest.
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py")
PYTEST_COMMAND = "PYTHONPATH=vendor python3 -m pytest -q -p no:cacheprovider tests"
PYTEST_INI = "[pytest]\naddopts = -ra\n"


def write(path: str, content: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]}


def fix() -> dict[str, Any]:
    return {"tool_calls": [{"name": "replace_text", "arguments": FIX}]}


def script(*turns: dict[str, Any]) -> dict[str, Any]:
    finish = {"tool_calls": [{"name": "finish", "arguments": {"summary": "tests pass"}}]}
    return {"turns": [*turns, finish]}


def vendored_pytest() -> dict[str, str]:
    site = Path(pytest.__file__).resolve().parent.parent
    files: dict[str, str] = {}
    for name in PYTEST_PACKAGES:
        root = site / name
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"vendor/{path.relative_to(site)}"] = path.read_text()
    return files


def pytest_repository_create(root: Path, extra: dict[str, str] | None = None) -> Path:
    """The sample repository (add() broken), tested by a pytest committed with it."""
    files = {**demo.SAMPLE_FILES, **vendored_pytest(), "pytest.ini": PYTEST_INI, **(extra or {})}
    return demo.sample_repository_create(root, files)


def branches(bare: Path) -> list[str]:
    listing = subprocess.run(
        ["git", "--git-dir", str(bare), "for-each-ref", "--format=%(refname)", "refs/heads"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listing.stdout.split()
