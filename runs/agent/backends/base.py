"""The sandbox backend interface: start one command confined to one working copy.

A backend only starts and kills; supervision (wall clock, cancellation, output capture,
the working-copy size watch) is the same for every backend and lives in
``runs.agent.sandbox``. A container backend (Docker, Podman, a Kubernetes Job)
implements these two methods and registers its dotted path in ``SANDBOX_BACKEND``;
nothing in the agent changes. See docs/sandbox-backends.md.
"""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class Limits:
    """What one command may use; every value is a hard ceiling."""

    cpu_seconds: int
    memory_bytes: int
    file_size_bytes: int
    processes: int = 256
    workspace_bytes: int = 2 * 1024**3
    tmp_bytes: int = 256 * 1024**2
    # CPUs the whole command tree may use at once (a cgroup quota); 0: no quota.
    cpus: float = 1.0


class ContainmentUnavailable(OSError):
    """The backend cannot contain a command here (e.g. no cgroup could be made)."""


@dataclass
class CommandSpec:
    """One command to run in a sandbox.

    ``argv`` is executed directly (a string is run by ``/bin/sh -c`` inside the
    sandbox). ``env`` is the command's whole environment: backends add nothing from the
    host's. ``workdir`` is the host directory of the working copy, the only writable
    place; ``readonly_mounts`` maps working-copy-relative paths to host directories
    mounted read-only there (the repository's cached setup). ``network`` is False for
    everything but a repository's setup phase when its policy allows it.
    """

    argv: list[str] | str
    workdir: Path
    env: dict[str, str]
    limits: Limits
    network: bool = False
    readonly_mounts: dict[str, Path] = field(default_factory=dict)


class SandboxBackend(ABC):
    name: str = ""
    # False for backends that do not contain (development only); a system check refuses
    # them in production mode.
    contains: bool = True
    # Where the working copy appears to the command.
    workdir_inside: str = "/workspace"

    @abstractmethod
    def start(self, spec: CommandSpec, output: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the command with stdout and stderr to ``output``; return at once.

        The returned process must be the one whose death ends the whole command: when it
        is killed, or when the calling process dies, nothing the command started may
        survive.
        """

    @abstractmethod
    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """End the command and everything it started; returns once it is reaped."""

    def problems(self) -> list[str]:
        """Why this backend cannot work on this host (empty when it can)."""
        return []
