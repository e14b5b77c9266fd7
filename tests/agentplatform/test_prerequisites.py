"""A machine without bubblewrap or Chromium: make demo and make test stop within seconds,
before installing anything, naming each missing package and the command that installs it;
under REQUIRE_SERVICES=1 pytest ends with that message, never an INTERNALERROR."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.no_services


def _path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH of one directory holding the programs a shell needs here, minus ``hidden``
    (bwrap, chromium, apt-get are never linked unless asked for)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The interpreter itself, not a version manager's shell shim in front of it.
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    for name in ("make", "git", "sh", "bash", "env", "test", "touch", "bwrap", "chromium"):
        found = shutil.which(name)
        if found and name not in hidden:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def test_make_demo_without_bubblewrap_stops_at_once_and_says_how_to_install_it(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "agentplatform").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "agentplatform/prerequisites.py"):
        shutil.copy(ROOT / name, checkout / name)
    env = {"PATH": _path_without(tmp_path, "bwrap"), "HOME": str(tmp_path)}

    started = time.monotonic()
    done = subprocess.run(
        ["make", "demo"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode != 0
    assert time.monotonic() - started < 15
    assert "bwrap: package bubblewrap" in done.stderr
    assert "apt-get install -y -q bubblewrap" in done.stderr
    assert "git:" not in done.stderr  # only what is missing is named
    assert not (checkout / ".venv").exists(), "it installed before checking"


def test_pytest_under_require_services_without_chromium_is_one_clear_message(tmp_path):
    # A session of its own, not a worker of this one (xdist's variables would make it
    # one, and skip the check that belongs to the session's controller).
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TEST_PROCESS"))
    }
    env = {
        **inherited,
        "REQUIRE_SERVICES": "1",
        "CHROMIUM_PATH": str(tmp_path / "no-chromium"),
        "PATH": _path_without(tmp_path, "chromium"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-q", "tests/jobs/test_ids.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "INTERNALERROR" not in output
    assert "chromium: package chromium" in output
    assert "apt-get install -y -q chromium" in output
