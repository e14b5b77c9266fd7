"""Which files of a patch can change how tests are found or run, and which cannot."""

from __future__ import annotations

import pytest

from runs.agent.judge import judge_rules
from runs.agent.steering import runner_tampering, steering_changes

pytestmark = pytest.mark.no_services

BASE = {
    "calc/__init__.py",
    "calc/core.py",
    "tests/__init__.py",
    "tests/test_core.py",
    "types.py",  # the repository's own module of a standard-library name
    "setup.cfg",
    "pyproject.toml",
    "tox.ini",
    "package.json",
}
PYPROJECT = (
    '[project]\nname = "calc"\ndependencies = []\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'
)
SETUP_CFG = "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -q\n"
TOX_INI = "[tox]\nenvlist = py311\n\n[testenv]\ncommands = pytest\n"
PACKAGE_JSON = '{"name": "calc", "version": "1.0.0", "scripts": {"test": "jest"}}'
BASE_TEXT = {
    "pyproject.toml": PYPROJECT,
    "setup.cfg": SETUP_CFG,
    "tox.ini": TOX_INI,
    "package.json": PACKAGE_JSON,
}


def _changes(changed: dict[str, str | None], command: str = "python -m pytest -q") -> dict:
    """``changed``: path -> the patched text (None: deleted)."""
    patched_paths = (BASE | {p for p, t in changed.items() if t is not None}) - {
        p for p, t in changed.items() if t is None
    }
    found = steering_changes(
        changed=list(changed),
        base_paths=BASE,
        patched_paths=patched_paths,
        read_base=BASE_TEXT.get,
        read_patched=lambda path: changed.get(path),
        test_command=command,
    )
    return {change.path: change.kind for change in found}


@pytest.mark.parametrize(
    "path",
    [
        "unittest/__init__.py",
        "unittest/__main__.py",
        "pytest.py",
        "_pytest/main.py",
        "json.py",
        "src/random.py",  # src/ is not a package: it is a sys.path entry
        "tests/decimal.py",  # unittest's start directory is on sys.path
        "nose2/__init__.py",
    ],
)
def test_a_new_module_shadowing_a_runner_or_the_standard_library_is_found(path):
    assert _changes({path: "print('OK')\n"}) == {path: "shadows_module"}


@pytest.mark.parametrize(
    "path",
    [
        "calc/json.py",  # inside a package: calc.json, not json
        "calc/unittest/__init__.py",
        "types.py",  # the base already had it; a change to it is the repository's business
        "docs/unittest.md",
        "calc/core.py",
    ],
)
def test_modules_that_shadow_nothing_are_not_found(path):
    assert _changes({path: "x = 1\n"}) == {}


@pytest.mark.parametrize(
    "path",
    [
        "conftest.py",
        "tests/conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "noxfile.py",
        "Makefile",
        "build/rules.mk",
        "jest.config.js",
        ".mocharc.yml",
    ],
)
def test_runner_configuration_files_are_found_anywhere(path):
    assert _changes({path: "anything\n"}) == {path: "runner_config"}


@pytest.mark.parametrize("path", ["sitecustomize.py", "lib/usercustomize.py", "calc/evil.pth"])
def test_interpreter_start_up_hooks_are_found(path):
    assert _changes({path: "import os\n"}) == {path: "interpreter_hook"}


def test_a_deleted_conftest_is_found_too():
    assert _changes({"tests/conftest.py": None}) == {"tests/conftest.py": "runner_config"}


@pytest.mark.parametrize(
    ("path", "steering", "innocent"),
    [
        (
            "pyproject.toml",
            PYPROJECT.replace('"-q"', "\"-q -k 'not test_add'\""),
            PYPROJECT.replace("dependencies = []", 'dependencies = ["attrs"]'),
        ),
        (
            "setup.cfg",
            SETUP_CFG.replace("-q", "-q -p no:python"),
            SETUP_CFG.replace("name = calc", "name = calc2"),
        ),
        (
            "tox.ini",
            TOX_INI.replace("commands = pytest", "commands = true"),
            TOX_INI + "\n[flake8]\nmax-line-length = 100\n",
        ),
        (
            "package.json",
            PACKAGE_JSON.replace('"jest"', '"true"'),
            PACKAGE_JSON.replace('"1.0.0"', '"1.0.1"'),
        ),
    ],
)
def test_only_the_test_sections_of_shared_configuration_files_count(path, steering, innocent):
    assert _changes({path: steering}) == {path: "runner_config"}
    assert _changes({path: innocent}) == {}


def test_a_new_pyproject_with_a_pytest_section_is_found_and_one_without_is_not():
    assert _changes({"pyproject.toml": PYPROJECT}, command="make test") == {}  # unchanged
    with_section = {"backend/pyproject.toml": PYPROJECT}
    assert _changes(with_section) == {"backend/pyproject.toml": "runner_config"}
    plain = {"backend/pyproject.toml": '[project]\nname = "b"\n'}
    assert _changes(plain) == {}


def test_a_file_the_test_command_names_is_found():
    command = "./scripts/run-tests.sh --fast"
    assert _changes({"scripts/run-tests.sh": "exit 0\n"}, command) == {
        "scripts/run-tests.sh": "runner_script"
    }


def test_a_config_file_that_no_longer_parses_counts_as_changed():
    assert _changes({"pyproject.toml": "[tool.pytest.ini_options\n"}) == {
        "pyproject.toml": "runner_config"
    }


def test_the_judge_makes_steering_a_finding_that_waits_for_approval_not_a_refusal():
    files = [{"path": "conftest.py", "kind": "runner_config", "detail": "configures"}]
    verdict = judge_rules(
        diff_text="", files=["conftest.py"], lines_changed=3, forbidden_paths=[], steering=files
    )
    assert verdict.verdict == "accept"
    assert {"rule": "test_configuration", "severity": "approval", "files": files} in (
        verdict.findings
    )


def _added(path: str, *lines: str) -> str:
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


@pytest.mark.parametrize(
    "line",
    [
        "os._exit(0)",
        "unittest.TestCase.run = lambda self, result=None: None",
        "setattr(unittest.TestResult, 'wasSuccessful', lambda self: True)",
        "sys.modules['calc'] = FakeCalc()",
        "pytest_plugins = ['evil']",
        "def pytest_collection_modifyitems(items):",
        'print("Ran 2 tests in 0.001s")',
        'sys.stdout.write("2 passed in 0.01s")',
    ],
)
def test_added_lines_that_reach_into_the_runner_are_found(line):
    found = runner_tampering(_added("tests/test_new.py", "import os", line))
    assert [(c.path, c.kind) for c in found] == [("tests/test_new.py", "runner_tampering")]


def test_ordinary_test_code_is_not_tampering():
    diff = _added(
        "tests/test_new.py",
        "import sys",
        "import pytest",
        "def pytest_generate_tests(metafunc):",
        "    assert sys.modules['calc'] is not None",
        "    assert unittest.TestCase.run == run",
    )
    assert runner_tampering(diff) == []


def test_a_link_without_a_suffix_named_like_the_runner_is_found():
    assert _changes({"unittest": "calc/fake"}) == {"unittest": "shadows_module"}
