"""What in a patch can change how the tests are found or run.

The repository's test command is the registered one, and verification must not be
something the patch can steer: a top-level ``unittest`` package that prints "OK", a
``conftest.py`` that skips every test, an ``addopts`` that deselects them, a Makefile
whose ``test`` target is ``true``. ``steering_changes`` names each such file the patch
adds or changes; verification runs the patch with those files as the base commit has
them (``verification_diff``), and the judge reports them as a ``test_configuration``
finding, which always waits for a human.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import re
import shlex
import sys
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runs.agent import platform_git

# Test runners and what they load: a module of the patch under one of these names runs
# instead of the real one.
RUNNER_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "unittest",
        "doctest",
        "nose",
        "nose2",
        "xdist",
        "coverage",
        "hypothesis",
        "tox",
        "nox",
        "green",
        "trial",
        "twisted",
    }
)
SHADOWABLE = RUNNER_MODULES | frozenset(sys.stdlib_module_names)
MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pyd")
# Directories a runner puts on sys.path itself (unittest's start directory, pytest's
# rootdir-relative test directories): a module directly in one is top-level too.
TEST_DIRECTORIES = frozenset({"test", "tests", "testing", "spec"})
# Python runs these at start-up from any directory on sys.path.
INTERPRETER_HOOKS = ("sitecustomize.py", "usercustomize.py", "*.pth")
# Files that configure a runner or are the runner's script, as a whole.
RUNNER_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "noxfile.py",
    "Makefile",
    "makefile",
    "GNUmakefile",
    "*.mk",
    "jest.config.*",
    "vitest.config.*",
    "vitest.workspace.*",
    "vite.config.*",
    ".mocharc*",
    "karma.conf.*",
    "Rakefile",
    ".rspec",
    "phpunit.xml*",
)


@dataclass(frozen=True)
class SteeringChange:
    """One file of the patch that can change how tests are found or run."""

    path: str
    kind: str  # runner_config | runner_script | shadows_module | interpreter_hook
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _ini_sections(text: str, wanted: Callable[[str], bool]) -> dict[str, dict[str, str]]:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.read_string(text)
    return {name: dict(parser.items(name)) for name in parser.sections() if wanted(name)}


def _setup_cfg(text: str) -> Any:
    return _ini_sections(text, lambda name: name == "tool:pytest" or name.startswith("tox:"))


def _tox_ini(text: str) -> Any:
    return _ini_sections(text, lambda name: name in ("pytest", "tox") or name.startswith("testenv"))


def _pyproject(text: str) -> Any:
    data = tomllib.loads(text)
    tool = data.get("tool", {})
    return {
        "pytest": tool.get("pytest"),
        "tox": tool.get("tox"),
        "hatch-envs": tool.get("hatch", {}).get("envs"),
        "pdm-scripts": tool.get("pdm", {}).get("scripts"),
        "poe": tool.get("poe"),
        "pytest11": data.get("project", {}).get("entry-points", {}).get("pytest11"),
    }


def _package_json(text: str) -> Any:
    data = json.loads(text)
    if not isinstance(data, dict):
        return data
    return {key: data.get(key) for key in ("scripts", "jest", "mocha", "ava", "vitest")}


# File name -> (what its test sections are, the name of those sections for people).
SECTIONED_FILES: dict[str, tuple[Callable[[str], Any], str]] = {
    "setup.cfg": (_setup_cfg, "[tool:pytest] / [tox:*]"),
    "tox.ini": (_tox_ini, "[pytest] / [tox] / [testenv*]"),
    "pyproject.toml": (_pyproject, "[tool.pytest*] / [tool.tox] / test scripts / pytest11"),
    "package.json": (_package_json, "scripts / test runner settings"),
}


def _test_sections_differ(name: str, base: str | None, patched: str | None) -> bool:
    read, _ = SECTIONED_FILES[name]

    def sections(text: str | None) -> Any:
        return read(text) if text is not None else None

    try:
        before, after = sections(base), sections(patched)
    except (ValueError, configparser.Error, tomllib.TOMLDecodeError):
        # A file its runner cannot read either way is as good as changed.
        return True
    if base is None or patched is None:
        # Added or deleted: it matters only if it has test sections at all.
        present = after if base is None else before
        values = present.values() if isinstance(present, dict) else [present]
        return any(value not in (None, {}, []) for value in values)
    return bool(before != after)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _locations(paths: set[str]) -> set[str]:
    """Every path and every directory above one."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")
        found.update("/".join(parts[: index + 1]) for index in range(len(parts)))
    return found


def _shadowed_module(path: str, base_locations: set[str], patched_paths: set[str]) -> str | None:
    """The standard-library or test-runner module ``path`` makes importable under that
    name, if any: the component right below the root, below a directory that is not a
    package, or below a test directory."""
    parts = path.split("/")
    # No suffix: a link named ``unittest`` to a directory is a package all the same.
    if "." in parts[-1] and not parts[-1].endswith(MODULE_SUFFIXES):
        return None
    for index, part in enumerate(parts):
        parent = "/".join(parts[:index])
        top_level = (
            index == 0
            or f"{parent}/__init__.py" not in patched_paths
            or parts[index - 1] in TEST_DIRECTORIES
        )
        if not top_level:
            continue
        name = part.split(".", 1)[0] if index == len(parts) - 1 else part
        if name.startswith("__") or name not in SHADOWABLE:
            continue
        where = "/".join(parts[: index + 1])
        # The repository's own module of that name is its business; a new one, or any
        # change to a module named like a test runner, is not.
        if where not in base_locations or name in RUNNER_MODULES:
            return name
    return None


def _command_files(command: str) -> set[str]:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return {word.removeprefix("./") for word in words if "=" not in word}


def steering_changes(
    *,
    changed: list[str],
    base_paths: set[str],
    patched_paths: set[str],
    read_base: Callable[[str], str | None],
    read_patched: Callable[[str], str | None],
    test_command: str,
) -> list[SteeringChange]:
    """Every changed file (added, modified or deleted) that can change how the tests
    are found or run, with why."""
    command_files = _command_files(test_command)
    base_locations = _locations(base_paths)
    found: list[SteeringChange] = []
    for path in changed:
        name = path.rsplit("/", 1)[-1]
        if path in command_files:
            found.append(SteeringChange(path, "runner_script", "named by the test command"))
        elif _matches(name, INTERPRETER_HOOKS):
            found.append(SteeringChange(path, "interpreter_hook", "Python runs it at start-up"))
        elif _matches(name, RUNNER_FILES):
            found.append(SteeringChange(path, "runner_config", "configures the test runner"))
        elif name in SECTIONED_FILES:
            if _test_sections_differ(name, read_base(path), read_patched(path)):
                sections = SECTIONED_FILES[name][1]
                found.append(SteeringChange(path, "runner_config", f"changes {sections}"))
        elif path in patched_paths:
            module = _shadowed_module(path, base_locations, patched_paths)
            if module:
                found.append(
                    SteeringChange(path, "shadows_module", f"shadows the module {module!r}")
                )
    return found


# Added lines by which code the runner imports (a new test module, a helper) can take
# over the run itself: end the process with a made-up summary, replace the runner's
# own functions, register hooks or plugins, or swap modules out.
TAMPERING = re.compile(
    r"\bos\._exit\s*\("
    r"|^\s*(?:unittest|_?pytest|pluggy)(?:\.\w+)+\s*=(?!=)"
    r"|\bsetattr\(\s*(?:unittest|_?pytest|pluggy)\b"
    r"|\bsys\.modules\s*\[[^\]]*\]\s*=(?!=)"
    r"|\bpytest_plugins\s*="
    r"|^\s*def pytest_(?!generate_tests\b)\w+\s*\("
    r"|Ran \d+ tests? in|\d+ passed(?:,| in )",
)


def runner_tampering(diff_text: str) -> list[SteeringChange]:
    """Files whose added lines reach into the test runner (one entry per file, with the
    first such line): a judge finding, not something verification can undo."""
    found: dict[str, SteeringChange] = {}
    path = ""
    for line in diff_text.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
        elif line.startswith("+") and path not in found and TAMPERING.search(line[1:]):
            found[path] = SteeringChange(path, "runner_tampering", line[1:].strip()[:160])
    return list(found.values())


def patch_steering_changes(
    *, git_dir: Path, base: str, diff: str, files: list[str], test_command: str
) -> tuple[str, list[SteeringChange]]:
    """The tree of ``base`` plus ``diff`` and its test configuration changes."""
    tree = platform_git.patch_tree(git_dir=git_dir, base=base, diff=diff)
    if not files:
        return tree, []
    changes = steering_changes(
        changed=files,
        base_paths=platform_git.tree_paths(git_dir, base),
        patched_paths=platform_git.tree_paths(git_dir, tree),
        read_base=lambda path: platform_git.tree_file(git_dir, base, path),
        read_patched=lambda path: platform_git.tree_file(git_dir, tree, path),
        test_command=test_command,
    )
    return tree, changes


def verification_diff(*, git_dir: Path, base: str, tree: str, changes: list[SteeringChange]) -> str:
    """The patch as verification runs it: every file in ``changes`` as the base commit
    has it (absent when the base has none)."""
    return platform_git.tree_diff(git_dir, base, tree, leave_out=[c.path for c in changes])
