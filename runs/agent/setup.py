"""Per-repository setup: the repository's own environment, made once and shared read-only.

A repository's ``setup_command`` (e.g. ``python3 -m venv .venv && .venv/bin/pip install
-e .``) runs in the sandbox, in a fresh working copy, before the agent starts; the
network is off unless the repository's ``setup_network`` allows it, and only for this
phase. What it leaves at ``setup_cache_paths`` (``.venv`` by default) is moved into a
cache keyed by the repository, the command and the content of its lock files, made
read-only, and mounted read-only at the same place in every later sandbox of the
repository: the next run starts fast, tests run with the repository's environment (never
the platform's interpreter), and no run can change what the next one gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from runs.agent import platform_git, safefs
from runs.agent.sandbox import LocalSandbox, SandboxError
from runs.models import Repository

COMPLETE_MARKER = ".setup-complete"
MAX_LOCK_FILE_BYTES = 16 * 1024**2


class SetupFailed(SandboxError):
    """The repository's setup command failed; the run cannot start."""

    def __init__(self, message: str, *, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class SetupPlan:
    """What a run's setup is: the repository's own, or the one detected for it."""

    command: str
    network: bool
    cache_paths: tuple[str, ...]
    lock_files: tuple[str, ...]


def setup_plan(repository: Repository, detected: dict[str, Any] | None = None) -> SetupPlan:
    """The repository's setup; a detected environment's (``runs.agent.environment``)
    when the repository names none."""
    command = repository.setup_command.strip()
    cache_paths = list(repository.setup_cache_paths)
    lock_files = list(repository.setup_lock_files)
    if not command and detected:
        command = str(detected.get("setup_command", "")).strip()
        cache_paths = list(detected.get("cache_paths") or cache_paths)
        lock_files += [p for p in detected.get("lock_files") or [] if p not in lock_files]
    return SetupPlan(command, repository.setup_network, tuple(cache_paths), tuple(lock_files))


@dataclass
class SetupResult:
    key: str
    cached: bool
    duration_ms: int
    output: str = ""


def setup_key(repository: Repository, sandbox: LocalSandbox, plan: SetupPlan | None = None) -> str:
    """Repository, command, cache paths and the content of every lock file present."""
    plan = plan or setup_plan(repository)
    digest = hashlib.sha256()
    digest.update(json.dumps([repository.pk, plan.command, sorted(plan.cache_paths)]).encode())
    patterns = list(plan.lock_files)
    for entry in safefs.walk(sandbox.path):
        name = entry.path.rsplit("/", 1)[-1]
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            continue
        with contextlib.suppress(OSError, safefs.UnsafePath):
            content = safefs.read_bytes(sandbox.path, entry.path, limit=MAX_LOCK_FILE_BYTES)
            digest.update(entry.path.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()[:32]


def setup_cache_dir(repository: Repository, key: str) -> Path:
    return Path(settings.SETUP_CACHE_ROOT) / f"repository-{repository.pk}" / key


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One setup per cache key at a time on this host."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_only(root: Path) -> None:
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(directory) / name
            info = path.lstat()
            if not stat.S_ISLNK(info.st_mode):
                path.chmod(stat.S_IMODE(info.st_mode) & ~0o222)
    root.chmod(stat.S_IMODE(root.lstat().st_mode) & ~0o222)


def _capture(plan: SetupPlan, sandbox: LocalSandbox, cache: Path) -> None:
    """Move the setup's results out of the working copy into the cache, read-only."""
    staging = cache.parent / f".{cache.name}.{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for relative in plan.cache_paths:
            relative = safefs.clean(relative)
            if not relative:
                continue
            # A link here would make the read-only mount bind whatever it points at.
            kind = safefs.kind(sandbox.path, relative)
            if kind == "missing":
                continue
            if kind not in ("dir", "file"):
                raise SetupFailed(f"setup left {relative!r} as a {kind}, not a directory or file")
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(sandbox.path / relative), str(target))
        (staging / COMPLETE_MARKER).write_text("ok\n")
        _read_only(staging)
        staging.rename(cache)
    except BaseException:
        _writable_rmtree(staging)
        raise


def _writable_rmtree(path: Path) -> None:
    if not path.exists():
        return
    for directory, _, _ in os.walk(path, followlinks=False):
        with contextlib.suppress(OSError):
            Path(directory).chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def setup_mount(
    repository: Repository, sandbox: LocalSandbox, key: str, plan: SetupPlan | None = None
) -> None:
    """Mount the cached setup read-only at its place in the working copy."""
    cache = setup_cache_dir(repository, key)
    plan = plan or setup_plan(repository)
    sandbox.readonly_mounts = {
        safefs.clean(relative): cache / safefs.clean(relative)
        for relative in plan.cache_paths
        if safefs.clean(relative) and (cache / safefs.clean(relative)).exists()
    }


def setup_ensure(
    *,
    repository: Repository,
    sandbox: LocalSandbox,
    base_commit: str,
    key: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    plan: SetupPlan | None = None,
) -> SetupResult | None:
    """The repository's setup mounted into ``sandbox``: from the cache (``key``, when
    the run already has one), or made now; None when there is no setup command.

    The setup always runs in a scratch checkout of ``base_commit``, never in the agent's
    working copy: what the cache holds is a function of the repository's committed files
    only, so no run's edits can reach another run's environment.
    """
    plan = plan or setup_plan(repository)
    command = plan.command
    if not command:
        return None
    started = time.monotonic()
    output = ""
    cached = key is not None and (setup_cache_dir(repository, key) / COMPLETE_MARKER).exists()
    if not cached:
        if sandbox.git_dir is None:
            raise SetupFailed("the working copy has no platform repository to set up from")
        scratch = LocalSandbox(f"setup-{uuid.uuid4().hex}", backend=sandbox.backend)
        scratch.create()
        try:
            platform_git.worktree_create(
                git_dir=sandbox.git_dir, workdir=scratch.path, commit=base_commit
            )
            key = setup_key(repository, scratch, plan)
            cache = setup_cache_dir(repository, key)
            with _locked(cache.parent / f".{key}.lock"):
                cached = (cache / COMPLETE_MARKER).exists()
                if not cached:
                    result = scratch.run(
                        command,
                        timeout=settings.SETUP_TIMEOUT_SECONDS,
                        should_stop=should_stop,
                        network=plan.network,
                    )
                    output = result.output
                    if not result.ok:
                        why = "timed out" if result.timed_out else f"exit code {result.exit_code}"
                        raise SetupFailed(
                            f"setup command failed ({why}): {output[-2000:]}", output=output
                        )
                    _capture(plan, scratch, cache)
        finally:
            scratch.remove()
    assert key is not None
    setup_mount(repository, sandbox, key, plan)
    return SetupResult(
        key=key,
        cached=cached,
        duration_ms=int((time.monotonic() - started) * 1000),
        output=output,
    )
