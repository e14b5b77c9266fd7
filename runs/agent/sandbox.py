"""Sandboxes: a private working copy per run and a guarded way to run commands in it.

The backend is an interface (``Sandbox``) so a container backend can replace the local
one; the rest of the agent only sees ``path``, ``run`` and ``remove``. Files of the working
copy are read and written through ``runs.agent.safefs``, never by resolving paths.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

# The only host variables a sandboxed command sees. Tokens, keys and database URLs of
# the platform never reach the repository's code.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


class SandboxError(Exception):
    """A sandbox operation failed in a way the agent cannot correct."""


class CommandCancelled(SandboxError):
    pass


@dataclass
class CommandResult:
    argv: list[str] | str
    exit_code: int | None
    output: str
    duration_ms: int
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ResourceLimits:
    cpu_seconds: int
    memory_bytes: int
    file_size_bytes: int

    @classmethod
    def from_settings(cls) -> ResourceLimits:
        return cls(
            cpu_seconds=settings.SANDBOX_CPU_SECONDS,
            memory_bytes=settings.SANDBOX_MEMORY_BYTES,
            file_size_bytes=settings.SANDBOX_FILE_SIZE_BYTES,
        )


class Sandbox(ABC):
    """A working copy and a way to run commands confined to it."""

    path: Path

    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def create(self) -> None: ...

    @abstractmethod
    def remove(self) -> None: ...

    @abstractmethod
    def run(
        self,
        command: list[str] | str,
        *,
        timeout: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> CommandResult: ...


def _git_env() -> dict[str, str]:
    env = {key: os.environ[key] for key in ENV_ALLOWLIST if key in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        {
            "HOME": str(settings.SANDBOX_ROOT),
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "agentplatform",
            "GIT_AUTHOR_EMAIL": "agent@agentplatform.invalid",
            "GIT_COMMITTER_NAME": "agentplatform",
            "GIT_COMMITTER_EMAIL": "agent@agentplatform.invalid",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


class LocalSandbox(Sandbox):
    """A directory under SANDBOX_ROOT; commands run as child processes with rlimits."""

    def __init__(self, name: str, limits: ResourceLimits | None = None) -> None:
        self.root = Path(settings.SANDBOX_ROOT)
        self.path = self.root / name
        self.limits = limits or ResourceLimits.from_settings()

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self) -> None:
        self.remove()
        self.path.mkdir(parents=True)

    def remove(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    def environment(self) -> dict[str, str]:
        env = _git_env()
        env["HOME"] = str(self.path)
        return env

    def _limit(self) -> None:
        # Runs in the child between fork and exec.
        resource.setrlimit(resource.RLIMIT_CPU, (self.limits.cpu_seconds,) * 2)
        resource.setrlimit(resource.RLIMIT_AS, (self.limits.memory_bytes,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limits.file_size_bytes,) * 2)

    def run(
        self,
        command: list[str] | str,
        *,
        timeout: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> CommandResult:
        """Run a command in the working copy; kill its whole process group on timeout
        or when ``should_stop`` says so (cancellation)."""
        timeout = timeout if timeout is not None else settings.COMMAND_TIMEOUT_SECONDS
        limit = settings.COMMAND_OUTPUT_LIMIT_BYTES
        started = time.monotonic()
        log_path = self.root / f".{self.path.name}.out"
        self.root.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w+b") as log:
            process = subprocess.Popen(
                command,
                shell=isinstance(command, str),
                cwd=self.path,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self._limit,
            )
            timed_out = cancelled = False
            while True:
                try:
                    process.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started > timeout:
                        timed_out = True
                    elif should_stop is not None and should_stop():
                        cancelled = True
                    else:
                        continue
                    _kill_group(process)
                    break
            log.seek(0)
            raw = log.read(limit + 1)
        log_path.unlink(missing_ok=True)
        truncated = len(raw) > limit
        output = raw[:limit].decode("utf-8", errors="replace")
        if truncated:
            output += "\n[output truncated]"
        if cancelled:
            raise CommandCancelled("command stopped: run cancelled")
        return CommandResult(
            argv=command,
            exit_code=None if timed_out else process.returncode,
            output=output,
            duration_ms=int((time.monotonic() - started) * 1000),
            timed_out=timed_out,
            truncated=truncated,
        )

    def git(self, *args: str, timeout: float = 120) -> CommandResult:
        """A git command of the platform's own (diff, reset, commit) in the working copy.

        These run often, so they skip the resource-limit hook that makes every spawn a
        full fork; hooks and fsmonitor programs the agent may have configured are
        switched off, so no repository code runs here.
        """
        started = time.monotonic()
        argv = ["git", "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", *args]
        try:
            completed = subprocess.run(
                argv,
                cwd=self.path,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            output = (exc.output or b"").decode("utf-8", errors="replace")
            return CommandResult(
                argv, None, output, int((time.monotonic() - started) * 1000), timed_out=True
            )
        return CommandResult(
            argv,
            completed.returncode,
            completed.stdout.decode("utf-8", errors="replace"),
            int((time.monotonic() - started) * 1000),
        )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def sandbox_for_run(run_id: object) -> LocalSandbox:
    return LocalSandbox(f"run-{run_id}")


def sandbox_orphans_sweep(*, active_run_ids: set[str], min_age_seconds: float = 3600) -> list[str]:
    """Remove what ended runs left under SANDBOX_ROOT; returns the names removed.

    Working copies of runs that are no longer active go at once (their run ended on a
    machine that died before cleaning up, or moved to another worker). Scratch
    directories and command logs belong to steps in flight, so only old ones go.
    """
    root = Path(settings.SANDBOX_ROOT)
    removed: list[str] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for entry in root.iterdir():
        name = entry.name
        if entry.is_dir() and name.startswith("run-"):
            if name.removeprefix("run-") in active_run_ids:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(name)
        elif name.startswith(("push-", ".run-")):
            try:
                age = now - entry.stat().st_mtime
            except FileNotFoundError:
                continue
            if age < min_age_seconds:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(name)
    return removed
