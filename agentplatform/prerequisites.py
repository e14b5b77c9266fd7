"""The machine's own programs that ``make demo`` and ``make test`` need, checked in
seconds before anything is installed.

Run with the system's Python as a script, before the virtualenv exists (no Django, no
third-party import): ``python3 agentplatform/prerequisites.py demo|test [--no-install]``. As root on
a Debian-like system it installs what is missing with apt-get; otherwise, or if that
fails, it names each missing package with the command that installs it and exits 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Program:
    command: str  # what must be on PATH
    package: str  # the Debian package that provides it
    why: str


GIT = Program("git", "git", "clones, commits and pushes the agent's work")
BUBBLEWRAP = Program("bwrap", "bubblewrap", "the sandbox every agent command runs in")
CHROMIUM = Program("chromium", "chromium", "the browser tests of the console")

NEEDED: dict[str, tuple[Program, ...]] = {
    "demo": (GIT, BUBBLEWRAP),
    "serve": (GIT, BUBBLEWRAP),
    "bench": (GIT, BUBBLEWRAP),
    "chaos": (GIT, BUBBLEWRAP),
    "test": (GIT, BUBBLEWRAP, CHROMIUM),
}


def missing_programs(target: str, *, path: str | None = None) -> list[Program]:
    """The programs ``target`` needs that are not on ``path`` (default: $PATH)."""
    search = os.environ.get("PATH", "") if path is None else path
    found = []
    for program in NEEDED[target]:
        configured = os.environ.get("CHROMIUM_PATH", "") if program is CHROMIUM else ""
        if configured and os.path.exists(configured):
            continue
        if shutil.which(program.command, path=search) is None:
            found.append(program)
    return found


def install_command(missing: list[Program]) -> list[str]:
    return ["apt-get", "install", "-y", "-q", *sorted({p.package for p in missing})]


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _install(missing: list[Program]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing {', '.join(p.package for p in missing)} with apt-get ...", flush=True)
    for command in (["apt-get", "update", "-q"], install_command(missing)):
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            print(f"  {' '.join(command)} exited {done.returncode}", file=sys.stderr)
            return False
    return True


def report(missing: list[Program], target: str) -> str:
    """One line per missing program, then the command that installs them all."""
    lines = [f"make {target} needs programs this machine does not have:"]
    lines += [f"  {p.command}: package {p.package} ({p.why})" for p in missing]
    lines.append(f"install them with: sudo {' '.join(install_command(missing))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(NEEDED))
    parser.add_argument("--no-install", action="store_true", help="only check, never install")
    options = parser.parse_args(argv)
    missing = missing_programs(options.target)
    if missing and not options.no_install and _can_install() and _install(missing):
        missing = missing_programs(options.target)
    if missing:
        print(report(missing, options.target), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
