"""How a repository's tests run, told from its files, and how to tell an environment that
cannot run them from a patch that breaks them.

A repository registered without a ``test_command`` gets one detected at each run from
the files of its base commit, with a setup that installs its test dependencies in the
sandbox (network only there, by the repository's ``setup_network``):

- Python with pytest (a pytest configuration in pyproject.toml, setup.cfg, pytest.ini or
  tox.ini, a ``conftest.py``, or pytest among its requirements): a virtualenv at
  ``.venv`` with its requirements files, the project itself (editable, with its test
  extra) and pytest; ``.venv/bin/python -m pytest -q``.
- Other Python: the same virtualenv; ``.venv/bin/python -m unittest discover``.
- Node with a ``test`` script in package.json: ``npm ci`` (with a lock file) or
  ``npm install``; ``npm test``.
- Go (go.mod) and Rust (Cargo.toml): their module caches fetched into the working copy;
  ``go test ./...`` / ``cargo test --offline``.

The working copy is untrusted: every file is read through ``runs.agent.safefs``.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import re
import shlex
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runs.agent import safefs
from runs.agent.sandbox import CommandResult

MAX_MANIFEST_BYTES = 1024**2
# Directories whose files say nothing about how the repository's own tests run.
SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", ".tox", "build", "dist"})
MAX_WALKED = 20_000
TEST_EXTRAS = ("test", "tests", "testing", "dev")
# Downloads and builds go to a directory of the working copy, not the sandbox's small
# /tmp; it is left behind with the scratch copy the setup ran in.
SETUP_TMP = 'mkdir -p .setup-tmp && TMPDIR="$PWD/.setup-tmp"'
PIP = (
    f"{SETUP_TMP} .venv/bin/python -m pip install --no-cache-dir "
    "--disable-pip-version-check --no-input --progress-bar off"
)
# The npm init placeholder is not a test suite.
NPM_PLACEHOLDER = re.compile(r"no test specified", re.I)
PYTEST_REQUIREMENT = re.compile(r"^\s*pytest(?:[-_][\w.-]+)?\s*(?:$|[<>=!~\[;@ ,])", re.I)
PYTHON = re.compile(r"(?:^|/)python[\d.]*$")
# The interpreter's own answer to ``python -m X`` when X is not installed: the test runner
# is missing. An import error inside a test reads "ModuleNotFoundError: ..." instead.
RUNNER_MODULE_MISSING = re.compile(r"^\S*python[\d.]*: No module named [\w.]+", re.M)
NPM_SCRIPT_MISSING = re.compile(r"^npm (?:ERR!|error) [Mm]issing script", re.M)


@dataclass
class Environment:
    """What a run uses when its repository names no test command of its own."""

    kind: str
    test_command: str
    setup_command: str
    cache_paths: list[str]
    # Files whose content makes a new environment (besides the repository's lock files).
    lock_files: list[str] = field(default_factory=list)
    # What the detection went by, for the timeline.
    evidence: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read(root: Path, relative: str) -> str | None:
    if safefs.kind(root, relative) != "file":
        return None
    with contextlib.suppress(OSError, safefs.UnsafePath):
        return safefs.read_bytes(root, relative, limit=MAX_MANIFEST_BYTES).decode(
            "utf-8", errors="replace"
        )
    return None


def _toml(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def _ini(text: str | None) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    with contextlib.suppress(configparser.Error):
        parser.read_string(text or "")
    return parser


def _names(root: Path) -> list[str]:
    """Relative paths of the repository's files (not below SKIP_DIRS)."""
    with contextlib.suppress(OSError, safefs.UnsafePath):
        return [entry.path for entry in safefs.walk(root, skip_dirs=SKIP_DIRS, limit=MAX_WALKED)]
    return []


class _Python:
    """What a Python repository's files say about its tests and their dependencies."""

    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root
        self.names = names
        self.pyproject = _toml(_read(root, "pyproject.toml"))
        self.setup_cfg = _ini(_read(root, "setup.cfg"))
        self.requirements = sorted(
            n for n in names if "/" not in n and re.fullmatch(r"requirements[\w.-]*\.txt", n)
        )

    def is_python(self) -> bool:
        markers = ("pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "pytest.ini", "tox.ini")
        return bool(
            self.requirements
            or any(n in markers for n in self.names)
            or any(n.endswith(".py") for n in self.names)
        )

    def _dependency_lists(self) -> list[list[Any]]:
        project = self.pyproject.get("project", {})
        lists = [project.get("dependencies", [])]
        lists += list((project.get("optional-dependencies") or {}).values())
        lists += list((self.pyproject.get("dependency-groups") or {}).values())
        poetry = self.pyproject.get("tool", {}).get("poetry", {})
        lists.append(list(poetry.get("dev-dependencies", {})))
        lists += [list(g.get("dependencies", {})) for g in (poetry.get("group") or {}).values()]
        return [value for value in lists if isinstance(value, list)]

    def pytest_evidence(self) -> list[str]:
        found = []
        if "pytest" in self.pyproject.get("tool", {}):
            found.append("pyproject.toml [tool.pytest]")
        if any(
            isinstance(req, str) and PYTEST_REQUIREMENT.match(req)
            for deps in self._dependency_lists()
            for req in deps
        ):
            found.append("pyproject.toml names pytest")
        if self.setup_cfg.has_section("tool:pytest"):
            found.append("setup.cfg [tool:pytest]")
        declared = self.setup_cfg.get("options", "tests_require", fallback="")
        if self.setup_cfg.has_section("options.extras_require"):
            declared += "\n" + "\n".join(
                v for _, v in self.setup_cfg.items("options.extras_require")
            )
        if any(PYTEST_REQUIREMENT.match(line) for line in declared.splitlines()):
            found.append("setup.cfg names pytest")
        if "pytest.ini" in self.names:
            found.append("pytest.ini")
        tox = _ini(_read(self.root, "tox.ini")) if "tox.ini" in self.names else None
        if tox is not None and tox.has_section("pytest"):
            found.append("tox.ini [pytest]")
        found += [n for n in self.names if n.rsplit("/", 1)[-1] == "conftest.py"][:1]
        for name in self.requirements:
            if any(
                PYTEST_REQUIREMENT.match(line)
                for line in (_read(self.root, name) or "").splitlines()
            ):
                found.append(f"{name} names pytest")
        if re.search(r"\bpytest\b", _read(self.root, "setup.py") or ""):
            found.append("setup.py names pytest")
        return found

    def _extra(self) -> str:
        project = self.pyproject.get("project", {})
        extras = set((project.get("optional-dependencies") or {}).keys())
        if self.setup_cfg.has_section("options.extras_require"):
            extras |= set(self.setup_cfg.options("options.extras_require"))
        return next((extra for extra in TEST_EXTRAS if extra in extras), "")

    def _installable(self) -> bool:
        keys = ("project", "build-system")
        return (
            any(key in self.pyproject for key in keys)
            or "poetry" in self.pyproject.get("tool", {})
            or "setup.py" in self.names
            or self.setup_cfg.has_option("metadata", "name")
        )

    def setup_command(self, *, pytest: bool) -> str:
        args = []
        for name in self.requirements:
            args += ["-r", shlex.quote(name)]
        if self._installable():
            extra = self._extra()
            args += ["-e", shlex.quote(f".[{extra}]" if extra else ".")]
        groups = self.pyproject.get("dependency-groups") or {}
        group: list[Any] = next(
            (groups[g] for g in TEST_EXTRAS if isinstance(groups.get(g), list)), []
        )
        args += [shlex.quote(req) for req in group if isinstance(req, str)]
        if pytest:
            args.append("pytest")
        if not args:
            return "python3 -m venv --without-pip .venv"
        return f"python3 -m venv .venv && {PIP} {' '.join(args)}"

    def unittest_command(self) -> str:
        command = ".venv/bin/python -m unittest discover"
        if safefs.kind(self.root, "tests") == "dir":
            command += " -s tests"
            if "tests/__init__.py" in self.names:
                command += " -t ."
        return command + " -q"


def _node(root: Path, names: list[str]) -> Environment | None:
    if "package.json" not in names:
        return None
    try:
        manifest = json.loads(_read(root, "package.json") or "{}")
    except json.JSONDecodeError:
        return None
    scripts = manifest.get("scripts") if isinstance(manifest, dict) else None
    test = scripts.get("test") if isinstance(scripts, dict) else None
    if not isinstance(test, str) or not test.strip() or NPM_PLACEHOLDER.search(test):
        return None
    locked = any(n in names for n in ("package-lock.json", "npm-shrinkwrap.json"))
    install = "npm ci" if locked else "npm install"
    return Environment(
        kind="node",
        test_command="npm test",
        setup_command=f"{SETUP_TMP} {install} --no-audit --no-fund --cache .setup-tmp/npm",
        cache_paths=["node_modules"],
        lock_files=["package.json"],
        evidence=[f"package.json scripts.test: {test[:200]}"],
    )


def _go(names: list[str]) -> Environment | None:
    if "go.mod" not in names:
        return None
    cache = 'GOMODCACHE="$PWD/.gomodcache"'
    return Environment(
        kind="go",
        test_command=f"{cache} GOFLAGS=-mod=readonly go test ./...",
        setup_command=f"{cache} go mod download",
        cache_paths=[".gomodcache"],
        lock_files=["go.mod"],
        evidence=["go.mod"],
    )


def _cargo(names: list[str]) -> Environment | None:
    if "Cargo.toml" not in names:
        return None
    home = 'CARGO_HOME="$PWD/.cargo-home"'
    return Environment(
        kind="cargo",
        test_command=f"{home} cargo test --offline",
        setup_command=f"{home} cargo fetch",
        cache_paths=[".cargo-home"],
        lock_files=["Cargo.toml"],
        evidence=["Cargo.toml"],
    )


def environment_detect(root: Path) -> Environment | None:
    """The test command and setup the working copy at ``root`` calls for; None when its
    files say nothing about how its tests run."""
    names = _names(root)
    python = _Python(root, names)
    evidence = python.pytest_evidence()
    if evidence:
        return Environment(
            kind="python-pytest",
            test_command=".venv/bin/python -m pytest -q",
            setup_command=python.setup_command(pytest=True),
            cache_paths=[".venv"],
            evidence=evidence,
        )
    for found in (_node(root, names), _go(names), _cargo(names)):
        if found is not None:
            return found
    if python.is_python():
        return Environment(
            kind="python-unittest",
            test_command=python.unittest_command(),
            setup_command=python.setup_command(pytest=False),
            cache_paths=[".venv"],
            evidence=["Python files, no pytest configuration or requirement"],
        )
    return None


def _first_command(command: str) -> tuple[list[str], list[str]]:
    """The leading ``NAME=value`` assignments and the words of the first simple command of
    a shell line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    assignments: list[str] = []
    words: list[str] = []
    try:
        for word in lexer:
            if set(word) <= set(";&|<>()"):
                break
            if not words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
                assignments.append(word)
                continue
            words.append(word)
    except ValueError:
        return [], []
    return assignments, words


def preflight_command(test_command: str) -> str | None:
    """A quick check, run in the sandbox before the agent starts, that the test command's
    program is there (and, for ``python -m X``, that X is installed): a shell line that
    exits 127 saying what is missing; None when the command cannot be checked."""
    assignments, words = _first_command(test_command)
    if not words or words[0] in ("cd", "env", "exec", "sh", "bash"):
        return None
    program = shlex.quote(words[0])
    missing = shlex.quote(f"{words[0]}: not found (exit code 127)")
    if "/" in words[0]:
        check = f"[ -x {program} ] || {{ echo {missing}; exit 127; }}"
    else:
        check = f"command -v {program} >/dev/null 2>&1 || {{ echo {missing}; exit 127; }}"
    if PYTHON.search(words[0]) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
            return check
        top = module.split(".")[0]
        probe = shlex.quote(
            f'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("{top}") else 1)'
        )
        gone = shlex.quote(f"{words[0]}: No module named {module} (the test runner is missing)")
        # The command's own assignments (PYTHONPATH=vendor ...) apply to the probe too.
        runner = " ".join([*(shlex.quote(a) for a in assignments), program])
        check += f" && {{ {runner} -c {probe} || {{ echo {gone}; exit 127; }}; }}"
    return check


def environment_problem(result: CommandResult) -> str | None:
    """Why the test command could not run at all, when it is the environment's doing:
    a command not found or not executable, a test runner module or npm script missing."""
    if result.timed_out:
        return None
    if result.exit_code in (126, 127):
        what = "not found" if result.exit_code == 127 else "not executable"
        return f"a command of the tests was {what} (exit code {result.exit_code})"
    if RUNNER_MODULE_MISSING.search(result.output):
        return "the test runner is not installed in the repository's environment"
    if NPM_SCRIPT_MISSING.search(result.output):
        return "package.json has no such script"
    return None
