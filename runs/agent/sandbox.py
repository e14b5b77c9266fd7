"""Sandboxes: a private working copy per run attempt and a contained way to run commands.

Commands run through a backend (``runs.agent.backends``, chosen by ``SANDBOX_BACKEND``;
bubblewrap by default). This module supervises them the same way for every backend:
wall clock, cancellation, output cap, the working copy's size (watched while the
command runs and checked after it), and a kill of the whole tree on any way out of
``run`` (a timeout, a cancellation, a lost lease, a soft time limit raised into the
worker). Files of the working copy are read and written through ``runs.agent.safefs``;
the platform's own git never runs in the working copy (``runs.agent.platform_git``).

Each lease attempt of a run works in its own directory (``run-<id>-<attempt>``), so a
command left over from an older attempt can never write into the current one.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from runs.agent.backends import CommandSpec, Limits, SandboxBackend, backend_get
from runs.agent.backends.cgroups import cgroups_sweep
from runs.agent.slots import SlotWaitCancelled, cpu_slot
from runs.agent.waits import connections_release_for_wait

# Host variables a command may inherit from the worker: locale only. Tokens, keys and
# database URLs of the platform never reach the repository's code.
ENV_ALLOWLIST = ("LANG", "LC_ALL", "TZ")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
WATCH_INTERVAL_SECONDS = 1.0


def platform_repository_root() -> Path:
    """Where the platform's own git repositories of runs live (``runs.agent.platform_git``)."""
    return Path(settings.PLATFORM_GIT_ROOT)


def platform_repository_path(run_id: object) -> Path:
    return platform_repository_root() / f"run-{run_id}.git"


class SandboxError(Exception):
    """A sandbox operation failed in a way the agent cannot correct."""


class CommandCancelled(SandboxError):
    pass


class WorkspaceTooLarge(SandboxError):
    """A command made the working copy larger than SANDBOX_WORKSPACE_BYTES."""


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


ResourceLimits = Limits


def limits_from_settings() -> Limits:
    return Limits(
        cpu_seconds=settings.SANDBOX_CPU_SECONDS,
        memory_bytes=settings.SANDBOX_MEMORY_BYTES,
        file_size_bytes=settings.SANDBOX_FILE_SIZE_BYTES,
        processes=settings.SANDBOX_PROCESSES,
        workspace_bytes=settings.SANDBOX_WORKSPACE_BYTES,
        tmp_bytes=settings.SANDBOX_TMP_BYTES,
        cpus=settings.SANDBOX_CPUS,
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
        network: bool = False,
    ) -> CommandResult: ...


def tree_bytes(root: Path, *, stop_above: int | None = None) -> int:
    """Bytes a directory tree occupies (allocated or apparent, whichever is larger);
    links are not followed. Stops counting once ``stop_above`` is passed."""
    total = 0
    pending = [str(root)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += max(info.st_size, info.st_blocks * 512)
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(entry.path)
                    if stop_above is not None and total > stop_above:
                        return total
        except OSError:
            continue
    return total


class LocalSandbox(Sandbox):
    """A directory under SANDBOX_ROOT; commands run through the configured backend."""

    def __init__(
        self,
        name: str,
        limits: Limits | None = None,
        backend: SandboxBackend | None = None,
    ) -> None:
        self.root = Path(settings.SANDBOX_ROOT)
        self.path = self.root / name
        self.limits = limits or limits_from_settings()
        self.backend = backend or backend_get()
        # Working-copy-relative path -> host directory mounted read-only (setup cache).
        self.readonly_mounts: dict[str, Path] = {}
        # The platform-owned repository the working copy was made from (platform_git).
        self.git_dir: Path | None = None

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self) -> None:
        self.remove()
        self.path.mkdir(parents=True)

    def remove(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    @property
    def inside(self) -> str:
        """The working copy's path as commands see it."""
        return self.backend.workdir_inside or str(self.path)

    def environment(self) -> dict[str, str]:
        """The command's whole environment: locale, a PATH, identity; no host secret."""
        env = {key: os.environ[key] for key in ENV_ALLOWLIST if key in os.environ}
        env.setdefault("LANG", "C.UTF-8")
        system_path = SYSTEM_PATH if self.backend.contains else os.environ.get("PATH", "")
        env.update(
            {
                # The repository's own environment first (see the setup phase).
                "PATH": f"{self.inside}/.venv/bin:{system_path or SYSTEM_PATH}",
                # Caches tools write under HOME land in the private /tmp, not the patch.
                "HOME": "/tmp" if self.backend.contains else str(self.path),  # noqa: S108
                "TERM": "dumb",
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_AUTHOR_NAME": "agentplatform",
                "GIT_AUTHOR_EMAIL": "agent@agentplatform.invalid",
                "GIT_COMMITTER_NAME": "agentplatform",
                "GIT_COMMITTER_EMAIL": "agent@agentplatform.invalid",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        return env

    def run(
        self,
        command: list[str] | str,
        *,
        timeout: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        network: bool = False,
    ) -> CommandResult:
        """Run a command in the working copy; the whole tree is killed on timeout, on
        ``should_stop`` (cancellation, lost lease) and on any exception raised into the
        waiting worker. Raises WorkspaceTooLarge when the working copy outgrew its limit,
        during or after the command."""
        timeout = timeout if timeout is not None else settings.COMMAND_TIMEOUT_SECONDS
        limit = settings.COMMAND_OUTPUT_LIMIT_BYTES
        spec = CommandSpec(
            argv=command,
            workdir=self.path,
            env=self.environment(),
            limits=self.limits,
            network=network,
            readonly_mounts=dict(self.readonly_mounts),
        )
        log_path = self.root / f".{self.path.name}.out"
        self.root.mkdir(parents=True, exist_ok=True)
        timed_out = cancelled = too_large = False
        with open(log_path, "w+b") as log, self._slot(should_stop):
            started = time.monotonic()  # the wait for a slot is not the command's time
            process = self.backend.start(spec, log)
            try:
                next_watch = started + WATCH_INTERVAL_SECONDS
                while True:
                    try:
                        # Returns as soon as the command ends (no fixed polling delay).
                        process.wait(timeout=0.1)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    now = time.monotonic()
                    if now - started > timeout:
                        timed_out = True
                    elif should_stop is not None and should_stop():
                        cancelled = True
                    elif now >= next_watch:
                        next_watch = now + WATCH_INTERVAL_SECONDS
                        too_large = self._too_large()
                    if timed_out or cancelled or too_large:
                        break
            finally:
                # Reached on every way out, including SoftTimeLimitExceeded and
                # KeyboardInterrupt raised while waiting: nothing may outlive the call.
                self.backend.kill(process)
            log.seek(0)
            raw = log.read(limit + 1)
        log_path.unlink(missing_ok=True)
        if too_large or self._too_large():
            raise WorkspaceTooLarge(
                f"the working copy exceeded {self.limits.workspace_bytes} bytes; "
                "the command was stopped"
            )
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

    @contextmanager
    def _slot(self, should_stop: Callable[[], bool] | None) -> Iterator[None]:
        # The command waits for a CPU slot of the host (runs.agent.slots) before it
        # starts, and holds it until its whole tree is killed; the thread's database
        # connection goes back to the pool meanwhile (runs.agent.waits).
        connections_release_for_wait()
        try:
            with cpu_slot(should_stop):
                yield
        except SlotWaitCancelled as exc:
            raise CommandCancelled("command stopped: run cancelled") from exc

    def _too_large(self) -> bool:
        cap = self.limits.workspace_bytes
        return tree_bytes(self.path, stop_above=cap) > cap


def sandbox_for_run(run_id: object, attempt: int) -> LocalSandbox:
    """The working copy of one lease attempt of a run."""
    return LocalSandbox(f"run-{run_id}-{attempt}")


def run_workdirs(run_id: object) -> list[Path]:
    """Every working copy of the run on this host, of any attempt."""
    root = Path(settings.SANDBOX_ROOT)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"run-{run_id}-*") if p.is_dir())


def run_workdirs_remove(run_id: object, *, keep: Path | None = None) -> None:
    """Remove the run's working copies (but ``keep``) and, with none kept, its platform
    repository."""
    for path in run_workdirs(run_id):
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)
    if keep is None:
        shutil.rmtree(platform_repository_path(run_id), ignore_errors=True)


def _run_id_of(name: str) -> str:
    # run-<36-character uuid>-<attempt>
    return name[len("run-") : len("run-") + 36]


def sandbox_orphans_sweep(*, active_run_ids: set[str], min_age_seconds: float = 3600) -> list[str]:
    """Remove what ended runs left under SANDBOX_ROOT; returns the names removed.

    Working copies of runs that are no longer active go at once (their run ended on a
    machine that died before cleaning up, or moved to another worker). Scratch
    directories and command logs belong to steps in flight, so only old ones go.
    """
    cgroups_sweep()
    removed: list[str] = []
    now = time.time()
    git_root = platform_repository_root()
    if git_root.is_dir():
        for entry in git_root.iterdir():
            if entry.name.startswith("run-") and _run_id_of(entry.name) not in active_run_ids:
                shutil.rmtree(entry, ignore_errors=True)
    root = Path(settings.SANDBOX_ROOT)
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        name = entry.name
        if entry.is_dir() and name.startswith("run-"):
            if _run_id_of(name) in active_run_ids:
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
