"""bubblewrap: each command in fresh user, mount, pid, network, IPC, UTS and cgroup
namespaces, as an unprivileged uid with no capabilities and no_new_privs, seeing a
minimal read-only system, its own working copy (the only writable place), a private
size-capped /tmp and its own /proc.

The launcher (bwrap) is started with an environment of nothing but PATH: inside the pid
namespace a command can read the environ of every ancestor it can see, which is bwrap
itself, so no ancestor may hold a secret. ``--die-with-parent`` ties the sandbox to the
worker: when the worker dies, for any reason, the kernel kills bwrap's init and with it
every process of the pid namespace. Limits on processes, memory, CPU time and file size
are set inside the namespace (``prlimit``).

The kernel never applies the process limit to processes whose host uid is root, and a
sandbox started by a root worker maps to root outside its namespace. So when a pids
cgroup is writable (cgroup v1 ``pids`` or a delegated cgroup v2), every command also
gets a cgroup of its own with ``pids.max``: the limit then holds whoever runs the
worker. Run workers as an unprivileged user in production (docs/deploy).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import IO

from django.conf import settings

from runs.agent.backends.base import CommandSpec, SandboxBackend

SANDBOX_UID = 1000
SANDBOX_GID = 1000
PRLIMIT = "/usr/bin/prlimit"
# The parts of /etc a toolchain needs; nothing that holds a secret or names the host.
ETC_ALWAYS = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
)
ETC_NETWORK = ("resolv.conf", "hosts", "nsswitch.conf", "gai.conf", "host.conf", "services")
PASSWD = f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/workspace:/bin/sh\n"
GROUP = f"sandbox:x:{SANDBOX_GID}:\n"


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    """The read-only system every sandbox sees: /usr and the merged-usr links."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in ETC_ALWAYS:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for python_etc in sorted(Path("/etc").glob("python3*")):
        args += ["--ro-bind", str(python_etc), str(python_etc)]
    return tuple(args)


@functools.cache
def _identity_files() -> tuple[str, str]:
    """A passwd and group naming only the sandbox user (tools look the uid up)."""
    directory = Path(settings.VAR_DIR) / "sandbox-etc"
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, content in (("passwd", PASSWD), ("group", GROUP)):
        path = directory / name
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
        paths.append(str(path))
    return paths[0], paths[1]


@functools.cache
def pids_cgroup_root() -> Path | None:
    """A cgroup directory under which this process may create pids-limited children."""
    for candidate in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if not (candidate / "cgroup.procs").exists():
            continue
        if candidate == Path("/sys/fs/cgroup"):
            controllers = candidate / "cgroup.subtree_control"
            if not controllers.exists() or "pids" not in controllers.read_text().split():
                continue
        probe = candidate / f"agentplatform-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").exists():
                return candidate
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def cgroups_sweep(*, min_age_seconds: float = 300) -> int:
    """Remove the empty per-command cgroups that dead workers left behind; a cgroup
    still in use cannot be removed (the kernel refuses), so this is always safe."""
    root = pids_cgroup_root()
    if root is None:
        return 0
    removed = 0
    now = time.time()
    for cgroup in root.glob("agentplatform-*"):
        try:
            if now - cgroup.stat().st_mtime < min_age_seconds:
                continue
            cgroup.rmdir()
            removed += 1
        except OSError:
            continue
    return removed


class BubblewrapBackend(SandboxBackend):
    name = "bubblewrap"
    contains = True
    workdir_inside = "/workspace"

    def __init__(self) -> None:
        self.bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self._cgroups: dict[int, Path | None] = {}

    def problems(self) -> list[str]:
        found = []
        if not os.access(self.bwrap, os.X_OK):
            found.append("bwrap is not installed (apt-get install bubblewrap)")
        if not os.access(PRLIMIT, os.X_OK):
            found.append(f"{PRLIMIT} is missing (Debian package util-linux)")
        return found

    def argv(self, spec: CommandSpec) -> list[str]:
        limits = spec.limits
        passwd, group = _identity_files()
        args = [
            self.bwrap,
            "--unshare-all",
            *(["--share-net"] if spec.network else []),
            "--die-with-parent",
            "--new-session",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_GID),
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            *_system_mounts(),
            "--ro-bind",
            passwd,
            "/etc/passwd",
            "--ro-bind",
            group,
            "/etc/group",
        ]
        if spec.network:
            for name in ETC_NETWORK:
                if (Path("/etc") / name).exists():
                    args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(limits.tmp_bytes),
            "--tmpfs",
            "/tmp",  # noqa: S108 - the sandbox's own private tmpfs
            "--bind",
            str(spec.workdir),
            self.workdir_inside,
        ]
        for relative, source in sorted(spec.readonly_mounts.items()):
            args += ["--ro-bind", str(source), f"{self.workdir_inside}/{relative}"]
        # SWE-bench-trained models cd to /testbed: the same working copy, by a link in
        # the sandbox's own root (nothing of the host's is reachable through it).
        args += ["--symlink", self.workdir_inside, "/testbed"]
        # The sandbox's root (and the mount points bwrap made in it) is read-only too.
        args += ["--remount-ro", "/", "--chdir", self.workdir_inside, "--clearenv"]
        for key, value in sorted(spec.env.items()):
            args += ["--setenv", key, value]
        command = ["/bin/sh", "-c", spec.argv] if isinstance(spec.argv, str) else spec.argv
        args += [
            "--",
            PRLIMIT,
            f"--nproc={limits.processes}",
            f"--as={limits.memory_bytes}",
            f"--cpu={limits.cpu_seconds}",
            f"--fsize={limits.file_size_bytes}",
            "--core=0",
            "--",
            *command,
        ]
        return args

    def start(self, spec: CommandSpec, output: IO[bytes]) -> subprocess.Popen[bytes]:
        cgroup = self._cgroup(spec.limits.processes)

        def enter_cgroup() -> None:
            # In the child before exec: bwrap and all it starts are born in the cgroup.
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text("0")

        try:
            process = subprocess.Popen(
                self.argv(spec),
                # The launcher's own environment: nothing but a PATH (see the module doc).
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=enter_cgroup if cgroup is not None else None,
            )
        except BaseException:
            self._cgroup_remove(cgroup)
            raise
        self._cgroups[process.pid] = cgroup
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        # bwrap's init dies with bwrap (--die-with-parent), and the kernel kills every
        # process of a pid namespace whose init died.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        cgroup = self._cgroups.pop(process.pid, None)
        if cgroup is not None:
            with contextlib.suppress(OSError):
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
            self._cgroup_remove(cgroup)

    def _cgroup(self, processes: int) -> Path | None:
        root = pids_cgroup_root()
        if root is None:
            return None
        cgroup = root / f"agentplatform-{uuid.uuid4().hex}"
        try:
            cgroup.mkdir()
            (cgroup / "pids.max").write_text(str(processes))
        except OSError:
            self._cgroup_remove(cgroup)
            return None
        return cgroup

    @staticmethod
    def _cgroup_remove(cgroup: Path | None) -> None:
        if cgroup is None:
            return
        for _ in range(50):
            try:
                cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)  # its last processes are still being reaped
