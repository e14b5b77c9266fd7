"""A repository without a test command of its own: the test command and the setup that
installs its test dependencies are told from its files, for each kind of repository."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runs.agent.environment import environment_detect, environment_problem, preflight_command
from runs.agent.sandbox import CommandResult

PYTEST = ".venv/bin/python -m pytest -q"


def _repo(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


@pytest.mark.parametrize(
    ("files", "evidence"),
    [
        ({"pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n"}, "[tool.pytest]"),
        (
            {
                "pyproject.toml": '[project]\nname = "p"\nversion = "1"\n'
                '[project.optional-dependencies]\ntest = ["pytest>=7"]\n'
            },
            "pyproject.toml names pytest",
        ),
        (
            {"pyproject.toml": '[dependency-groups]\ndev = ["pytest-cov"]\n'},
            "pyproject.toml names pytest",
        ),
        ({"setup.cfg": "[tool:pytest]\ntestpaths = tests\n"}, "setup.cfg [tool:pytest]"),
        (
            {"setup.cfg": "[metadata]\nname = p\n[options.extras_require]\ntest =\n  pytest\n"},
            "setup.cfg names pytest",
        ),
        ({"pytest.ini": "[pytest]\n"}, "pytest.ini"),
        ({"tox.ini": "[tox]\nenvlist = py3\n[pytest]\naddopts = -q\n"}, "tox.ini [pytest]"),
        ({"tests/conftest.py": "", "tests/test_a.py": ""}, "tests/conftest.py"),
        ({"requirements-dev.txt": "ruff\npytest==8.0\n"}, "requirements-dev.txt names pytest"),
    ],
)
def test_pytest_is_detected_from_each_kind_of_configuration(tmp_path, files, evidence):
    found = environment_detect(_repo(tmp_path, files))

    assert found is not None and found.kind == "python-pytest"
    assert found.test_command == PYTEST
    assert any(evidence in item for item in found.evidence), found.evidence
    # The setup makes the repository's own virtualenv and installs pytest into it.
    assert found.setup_command.startswith("python3 -m venv .venv && ")
    assert found.setup_command.endswith(" pytest")
    assert found.cache_paths == [".venv"]


def test_the_setup_installs_requirements_and_the_project_with_its_test_extra(tmp_path):
    root = _repo(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "p"\nversion = "1"\n'
            '[project.optional-dependencies]\ndocs = ["sphinx"]\n'
            'tests = ["pytest", "hypothesis"]\n',
            "requirements.txt": "requests\n",
            "requirements-dev.txt": "pytest\n",
            "sub/requirements.txt": "ignored\n",
        },
    )

    found = environment_detect(root)

    assert found is not None
    command = found.setup_command
    assert "-r requirements-dev.txt -r requirements.txt" in command
    assert "-e '.[tests]'" in command
    assert "sub/requirements.txt" not in command
    assert "--no-cache-dir" in command  # pip's cache would fill the sandbox's small /tmp
    assert 'TMPDIR="$PWD/.setup-tmp"' in command


def test_a_python_repository_without_pytest_gets_unittest(tmp_path):
    package = _repo(tmp_path / "a", {"calc/core.py": "", "tests/__init__.py": "", "tests/t.py": ""})
    flat = _repo(tmp_path / "b", {"tests/test_x.py": "import unittest\n"})
    top = _repo(tmp_path / "c", {"test_x.py": ""})

    found = [environment_detect(root) for root in (package, flat, top)]

    assert all(f is not None and f.kind == "python-unittest" for f in found)
    commands = [f.test_command for f in found if f]
    assert commands == [
        ".venv/bin/python -m unittest discover -s tests -t . -q",
        ".venv/bin/python -m unittest discover -s tests -q",
        ".venv/bin/python -m unittest discover -q",
    ]
    # Nothing to install: a virtualenv without pip is enough (and quick).
    assert all(f.setup_command == "python3 -m venv --without-pip .venv" for f in found if f)


def test_node_with_a_test_script_gets_npm_test_and_an_install(tmp_path):
    manifest = {"name": "n", "scripts": {"test": "node --test"}}
    plain = _repo(tmp_path / "a", {"package.json": json.dumps(manifest)})
    locked = _repo(
        tmp_path / "b", {"package.json": json.dumps(manifest), "package-lock.json": "{}"}
    )

    found = [environment_detect(root) for root in (plain, locked)]

    assert [(f.kind, f.test_command) for f in found if f] == [("node", "npm test")] * 2
    installs = [f.setup_command.split(" --")[0].rsplit(" ", 2)[-2:] for f in found if f]
    assert installs == [["npm", "install"], ["npm", "ci"]]
    # npm's cache and temporary files in the working copy, not the sandbox's small /tmp.
    assert all("--cache .setup-tmp/npm" in f.setup_command for f in found if f)
    assert all(
        f.cache_paths == ["node_modules"] and "package.json" in f.lock_files for f in found if f
    )


def test_the_npm_init_placeholder_is_no_test_suite(tmp_path):
    manifest = {"scripts": {"test": 'echo "Error: no test specified" && exit 1'}}
    assert environment_detect(_repo(tmp_path, {"package.json": json.dumps(manifest)})) is None


def test_go_and_cargo_keep_their_module_caches_in_the_working_copy(tmp_path):
    go = environment_detect(_repo(tmp_path / "go", {"go.mod": "module x\n"}))
    cargo = environment_detect(_repo(tmp_path / "rs", {"Cargo.toml": "[package]\nname='x'\n"}))

    assert go is not None and go.kind == "go" and "go test ./..." in go.test_command
    assert go.cache_paths == [".gomodcache"] and "go mod download" in go.setup_command
    assert cargo is not None and cargo.kind == "cargo"
    assert "cargo test --offline" in cargo.test_command and "cargo fetch" in cargo.setup_command


def test_a_repository_that_says_nothing_about_tests_gets_no_guess(tmp_path):
    assert environment_detect(_repo(tmp_path, {"README.md": "hello\n"})) is None


def test_links_in_the_working_copy_are_not_followed(tmp_path):
    outside = _repo(tmp_path / "outside", {"pytest.ini": "[pytest]\n", "pyproject.toml": ""})
    root = _repo(tmp_path / "repo", {"README.md": ""})
    os.symlink(outside / "pyproject.toml", root / "pyproject.toml")
    os.symlink(outside, root / "linked")

    assert environment_detect(root) is None


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ("python -m pytest -q", "python"),
        ("FOO=1 npm test", "npm"),
        (".venv/bin/python -m unittest discover && echo ok", ".venv/bin/python"),
    ],
)
def test_the_preflight_checks_the_first_program(command, program):
    check = preflight_command(command)
    assert check is not None and program in check and "exit 127" in check


def test_the_preflight_checks_a_python_test_runner_module():
    check = preflight_command("python3 -m pytest -q")
    assert check is not None and 'find_spec("pytest")' in check


@pytest.mark.parametrize(
    ("exit_code", "output", "environment"),
    [
        (127, "sh: 1: python: not found\n", True),
        (126, "sh: 1: ./run: Permission denied\n", True),
        (1, "/workspace/.venv/bin/python: No module named pytest\n", True),
        (1, 'npm ERR! Missing script: "test"\n', True),
        (1, "ModuleNotFoundError: No module named 'calc'\n", False),
        (1, "FAILED tests/test_core.py::test_add\n", False),
        (2, "error: expected ';'\n", False),
    ],
)
def test_environment_failures_are_told_from_failing_tests(exit_code, output, environment):
    result = CommandResult(argv="t", exit_code=exit_code, output=output, duration_ms=1)
    assert (environment_problem(result) is not None) is environment
