"""Ordinary repositories as users bring them (a pytest project, a Node package), each with
a failing test, and the scripted agent's fix for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runs import demo

PYTEST_FILES = {
    "pyproject.toml": (
        "[build-system]\n"
        'requires = ["setuptools>=61"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        'name = "shapes"\n'
        'version = "0.1.0"\n'
        'requires-python = ">=3.9"\n\n'
        "[project.optional-dependencies]\n"
        'test = ["pytest>=7"]\n\n'
        "[tool.setuptools]\n"
        'packages = ["shapes"]\n\n'
        "[tool.pytest.ini_options]\n"
        'testpaths = ["tests"]\n'
    ),
    "shapes/__init__.py": "from shapes.area import rectangle\n",
    "shapes/area.py": "def rectangle(width, height):\n    return width + height\n",
    # pytest's own features: the suite cannot pass without pytest installed.
    "tests/test_area.py": (
        "import pytest\n\nfrom shapes import rectangle\n\n\n"
        '@pytest.mark.parametrize(("w", "h", "area"), [(2, 3, 6), (1.5, 2, 3.0)])\n'
        "def test_rectangle(w, h, area):\n"
        "    assert rectangle(w, h) == pytest.approx(area)\n"
    ),
}

NODE_FILES = {
    "package.json": (
        '{\n  "name": "greet",\n  "version": "1.0.0",\n  "private": true,\n'
        '  "scripts": {"test": "node --test"}\n}\n'
    ),
    "greet.js": "exports.greet = (name) => `Hello ${name}`;\n",
    "test/greet.test.js": (
        "const test = require('node:test');\n"
        "const assert = require('node:assert');\n"
        "const { greet } = require('../greet');\n\n"
        "test('greets by name', () => {\n"
        "  assert.strictEqual(greet('Ada'), 'Hello, Ada!');\n"
        "});\n"
    ),
}


def pytest_repository_create(root: Path) -> Path:
    return demo.sample_repository_create(root, PYTEST_FILES)


def node_repository_create(root: Path) -> Path:
    return demo.sample_repository_create(root, NODE_FILES)


def fix_script(path: str, old: str, new: str) -> dict[str, Any]:
    """A scripted agent that reads ``path``, replaces ``old`` with ``new``, runs the
    repository's tests (whatever its test command) and finishes."""
    return {
        "plan": f"1. Read {path}. 2. Fix it. 3. Run the tests. 4. Finish.",
        "turns": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]},
            {
                "tool_calls": [
                    {
                        "name": "replace_text",
                        "arguments": {"path": path, "old": old, "new": new},
                    }
                ]
            },
            {"tool_calls": [{"name": "run_tests", "arguments": {}}]},
            {"tool_calls": [{"name": "finish", "arguments": {"summary": f"Fixed {path}."}}]},
        ],
    }


PYTEST_FIX = fix_script("shapes/area.py", "width + height", "width * height")
NODE_FIX = fix_script("greet.js", "`Hello ${name}`", "`Hello, ${name}!`")
