"""A cgroup per sandboxed command: memory, processes and CPU limited over the whole tree.

The kernel charges every page a process of the command touches (its heap, its page
cache, and the tmpfs pages it writes to ``/tmp`` and ``/dev/shm``) to the cgroup it was
born in, and the OOM killer of a full cgroup only picks processes inside it: the worker
and the other sandboxes are never the victims.

Where the cgroups go:

- cgroup v2: under ``SANDBOX_CGROUP_ROOT`` when set (a delegated directory whose
  ``cgroup.subtree_control`` enables ``memory`` and ``pids``); otherwise under the
  worker's own cgroup or the nearest ancestor where those controllers are enabled (or
  can be: a cgroup with no process of its own).
- cgroup v1 (hybrid hosts): under the worker's own cgroup of the ``memory``, ``pids``
  and ``cpu`` hierarchies.

Each command's cgroup is ``agentplatform-<hex>``; the launcher enters it between fork
and exec, so everything the command starts is born inside.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

PREFIX = "agentplatform-"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLayout:
    """Where per-command cgroups are made: one v2 directory, or one per v1 controller."""

    version: int
    # v2: {"unified": dir}; v1: {"memory": dir, "pids": dir, "cpu": dir (optional)}
    parents: dict[str, Path]


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(filesystem type, mount point, root inside the hierarchy, super options)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if len(fields) < 5 or len(extra) < 3:
                continue
            found.append((extra[0], Path(fields[4]), fields[3], set(extra[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per controller ("" for the v2 hierarchy)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _inside(mount: Path, mount_root: str, own: str) -> Path:
    relative = own[len(mount_root) :] if own.startswith(mount_root) else own
    return mount / relative.lstrip("/")


def _v2_usable(directory: Path) -> bool:
    """Children of ``directory`` get memory.max and pids.max (enabling them if allowed)."""
    control = directory / "cgroup.subtree_control"
    try:
        enabled = set(control.read_text().split())
    except OSError:
        return False
    if not {"memory", "pids"} <= enabled:
        try:
            control.write_text("+memory +pids")
        except OSError:
            return False  # a cgroup with processes of its own cannot delegate controllers
    with contextlib.suppress(OSError):
        if "cpu" not in enabled and "cpu" in (directory / "cgroup.controllers").read_text():
            control.write_text("+cpu")
    probe = directory / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "memory.max").exists() and (probe / "pids.max").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _v2_layout(configured: str) -> CgroupLayout | None:
    if configured:
        usable = _v2_usable(Path(configured))
        return CgroupLayout(2, {"unified": Path(configured)}) if usable else None
    own = _own_paths().get("")
    for fstype, mount, mount_root, _ in _mounts():
        if fstype != "cgroup2" or own is None:
            continue
        with contextlib.suppress(OSError):
            if "memory" not in (mount / "cgroup.controllers").read_text().split():
                continue
        directory = _inside(mount, mount_root, own)
        while True:
            if _v2_usable(directory):
                return CgroupLayout(2, {"unified": directory})
            if directory == mount:
                break
            directory = directory.parent
    return None


def _v1_layout() -> CgroupLayout | None:
    own = _own_paths()
    parents: dict[str, Path] = {}
    for fstype, mount, mount_root, options in _mounts():
        if fstype != "cgroup":
            continue
        for controller in ("memory", "pids", "cpu"):
            if controller in options and controller in own and controller not in parents:
                directory = _inside(mount, mount_root, own[controller])
                if os.access(directory, os.W_OK):
                    parents[controller] = directory
    if "memory" not in parents or "pids" not in parents:
        return None
    return CgroupLayout(1, parents)


@functools.cache
def _layout(configured: str) -> CgroupLayout | None:
    if configured:
        return _v2_layout(configured)
    return _v2_layout("") or _v1_layout()


def layout(configured: str | None = None) -> CgroupLayout | None:
    """Where this process makes its commands' cgroups (SANDBOX_CGROUP_ROOT unless
    ``configured`` is given); None when it cannot."""
    return _layout(settings.SANDBOX_CGROUP_ROOT if configured is None else configured)


def problem(configured: str | None = None) -> str | None:
    """Why no command could get a cgroup of its own here (None when it can)."""
    configured = settings.SANDBOX_CGROUP_ROOT if configured is None else configured
    if layout(configured) is not None:
        return None
    if configured and not Path(configured).is_dir():
        return f"SANDBOX_CGROUP_ROOT={configured!r} does not exist"
    if configured:
        return (
            f"SANDBOX_CGROUP_ROOT={configured!r} is not a cgroup v2 directory this user may "
            "create children in with the memory and pids controllers enabled"
        )
    return (
        "no cgroup with the memory and pids controllers can be created: delegate a cgroup "
        "v2 subtree to the worker's user (memory and pids in its cgroup.subtree_control, "
        "e.g. systemd Delegate=yes) and name it in SANDBOX_CGROUP_ROOT"
    )


class CommandCgroup:
    """One command's cgroup (one directory on v2, one per controller on v1)."""

    def __init__(self, directories: list[Path], version: int) -> None:
        self.directories = directories
        self.version = version

    @classmethod
    def create(cls, *, memory_bytes: int, processes: int, cpus: float) -> CommandCgroup:
        """Raises OSError when no cgroup can be made (the caller refuses to run)."""
        found = layout()
        if found is None:
            raise OSError(problem() or "no cgroup available")
        name = f"{PREFIX}{uuid.uuid4().hex}"
        cgroup = cls([parent / name for parent in found.parents.values()], found.version)
        try:
            for directory in cgroup.directories:
                directory.mkdir()
            cgroup._limit(memory_bytes, processes, cpus)
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    def _limit(self, memory_bytes: int, processes: int, cpus: float) -> None:
        quota = f"{int(cpus * CPU_PERIOD_US)}" if cpus > 0 else "max"
        for directory in self.directories:
            if self.version == 2:
                (directory / "memory.max").write_text(str(memory_bytes))
                # No swap either: the limit is on memory the host actually gives up.
                with contextlib.suppress(FileNotFoundError):
                    (directory / "memory.swap.max").write_text("0")
                (directory / "pids.max").write_text(str(processes))
                with contextlib.suppress(FileNotFoundError):
                    (directory / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
                continue
            if (directory / "memory.limit_in_bytes").exists():
                (directory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (directory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            if (directory / "pids.max").exists():
                (directory / "pids.max").write_text(str(processes))
            if (directory / "cpu.cfs_quota_us").exists():
                (directory / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (directory / "cpu.cfs_quota_us").write_text(quota if cpus > 0 else "-1")

    def enter(self) -> None:
        """Move the calling process in (called between fork and exec)."""
        for directory in self.directories:
            (directory / "cgroup.procs").write_text("0")

    def oom_kills(self) -> int:
        """How many processes the memory limit killed."""
        for directory in self.directories:
            name = "memory.events" if self.version == 2 else "memory.oom_control"
            with contextlib.suppress(OSError, ValueError):
                for line in (directory / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def kill(self) -> None:
        """SIGKILL every process still inside."""
        for directory in self.directories:
            if self.version == 2:
                with contextlib.suppress(OSError):
                    (directory / "cgroup.kill").write_text("1")
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        for directory in self.directories:
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.01)  # its last processes are still being reaped


def cgroups_sweep(*, min_age_seconds: float = 300) -> int:
    """Remove the empty per-command cgroups that dead workers left behind; a cgroup
    still in use cannot be removed (the kernel refuses), so this is always safe."""
    found = layout()
    if found is None:
        return 0
    removed = 0
    now = time.time()
    for parent in found.parents.values():
        for cgroup in parent.glob(f"{PREFIX}*"):
            try:
                if now - cgroup.stat().st_mtime < min_age_seconds:
                    continue
                cgroup.rmdir()
                removed += 1
            except OSError:
                continue
    return removed
