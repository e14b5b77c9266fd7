"""The sample repository and scripted agent used by ``make demo`` and the tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

SAMPLE_FILES = {
    "README.md": "# calc\n\nA tiny calculator package.\n",
    "calc/__init__.py": ('from calc.core import add, multiply\n\n__all__ = ["add", "multiply"]\n'),
    "calc/core.py": (
        '"""Arithmetic."""\n\n\n'
        "def add(a: int, b: int) -> int:\n"
        "    return a - b\n\n\n"
        "def multiply(a: int, b: int) -> int:\n"
        "    return a * b\n"
    ),
    "tests/__init__.py": "",
    "tests/test_core.py": (
        "import unittest\n\nfrom calc import add, multiply\n\n\n"
        "class CoreTest(unittest.TestCase):\n"
        "    def test_add(self):\n"
        "        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_multiply(self):\n"
        "        self.assertEqual(multiply(2, 3), 6)\n\n\n"
        'if __name__ == "__main__":\n'
        "    unittest.main()\n"
    ),
}

GIT_ENV = {
    "GIT_AUTHOR_NAME": "demo",
    "GIT_AUTHOR_EMAIL": "demo@example.invalid",
    "GIT_COMMITTER_NAME": "demo",
    "GIT_COMMITTER_EMAIL": "demo@example.invalid",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=GIT_ENV)


def sample_repository_create(root: Path, files: dict[str, str] | None = None) -> Path:
    """A bare repository at ``root/calc.git`` whose main branch has a failing test."""
    root.mkdir(parents=True, exist_ok=True)
    bare = root / "calc.git"
    seed = root / "calc-seed"
    _git("init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=root)
    _git("init", "--quiet", "--initial-branch=main", str(seed), cwd=root)
    for name, content in (files or SAMPLE_FILES).items():
        path = seed / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    _git("add", "--all", cwd=seed)
    _git("commit", "--quiet", "-m", "calc: add and multiply", cwd=seed)
    _git("push", "--quiet", str(bare), "main", cwd=seed)
    return bare


# The sample repository's setup: a virtualenv of its own in the working copy (it has no
# dependencies to install), and its interpreter for the tests.
SETUP_COMMAND = "python3 -m venv --without-pip .venv"
REPOSITORY_PYTHON = ".venv/bin/python"


def test_command(python: str = "python3") -> str:
    return f"{python} -m unittest discover -s tests -q"


def allowed_commands(python: str = "python3") -> list[str]:
    return ["python", "python3", python, "git", "ls", "cat", "grep"]


def fix_script(python: str = "python3") -> dict[str, Any]:
    """A scripted agent that finds the bug in ``add``, fixes it and runs the tests."""
    return {
        "plan": "1. Look at calc/core.py. 2. Fix add(). 3. Run the tests. 4. Finish.",
        "turns": [
            {
                "content": "Listing the repository.",
                "tool_calls": [{"name": "list_files", "arguments": {"path": "."}}],
            },
            {
                "content": "Reading the implementation.",
                "tool_calls": [{"name": "read_file", "arguments": {"path": "calc/core.py"}}],
            },
            {
                "content": "add() subtracts; it must add.",
                "tool_calls": [
                    {
                        "name": "replace_text",
                        "arguments": {
                            "path": "calc/core.py",
                            "old": "return a - b",
                            "new": "return a + b",
                        },
                    }
                ],
            },
            {
                "content": "Running the tests.",
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": f"{python} -m unittest discover -s tests -q"},
                    }
                ],
            },
            {
                "content": "Done.",
                "tool_calls": [
                    {
                        "name": "finish",
                        "arguments": {"summary": "add() now returns a + b; the tests pass."},
                    }
                ],
            },
        ],
    }
