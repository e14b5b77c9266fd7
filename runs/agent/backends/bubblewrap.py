"""bubblewrap: each command in fresh user, mount, pid, network, IPC, UTS and cgroup
namespaces, as an unprivileged uid with no capabilities and no_new_privs, seeing a
minimal read-only system, its own working copy (the only writable place), a private
size-capped /tmp and /dev/shm, a read-only /dev and its own /proc with /proc/sys and
the other host-wide files read-only. A seccomp filter (``runs.agent.backends.seccomp``)
keeps it from making user namespaces of its own.

The sandbox's uid 1000 is an unprivileged uid **on the host** too, whoever runs the
worker. bwrap maps the sandbox's uid to the uid that starts it, so a worker running as
an unprivileged user starts it directly. A root worker starts it through two steps: an
outer bwrap (root, a private mount namespace only) places the working copy, its
read-only mounts and the identity files under a tmpfs every user may traverse (the
worker's directories may be private to root), then ``setpriv`` drops to
``SANDBOX_HOST_UID``/``SANDBOX_HOST_GID`` and the inner bwrap builds the sandbox as that
user: ``/proc/self/uid_map`` reads ``1000 <that uid> 1`` and no process of the command
has any privilege over the host. The working copy is handed to that uid before each
command (files the worker wrote in between are root's).

The launcher is started with an environment of nothing but PATH: inside the pid
namespace a command can read the environ of every ancestor it can see, so no ancestor
may hold a secret. ``--die-with-parent`` (on both bwraps) ties the sandbox to the worker:
when the worker dies, for any reason, the kernel kills bwrap's init and with it every
process of the pid namespace. Each command gets a cgroup of its own
(``runs.agent.backends.cgroups``) limiting memory (every tmpfs page it writes included),
processes and CPU over the whole tree; per-process limits (address space, CPU seconds,
file size, no core files) are set inside with ``prlimit``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from django.conf import settings

from runs.agent.backends import cgroups, seccomp
from runs.agent.backends.base import CommandSpec, ContainmentUnavailable, Limits, SandboxBackend

SANDBOX_UID = 1000
SANDBOX_GID = 1000
PRLIMIT = "/usr/bin/prlimit"
SETPRIV = "/usr/bin/setpriv"
# The account whose ids a root worker's sandboxes run as, when it exists and
# SANDBOX_HOST_UID is not set; otherwise FALLBACK_HOST_ID, a uid no account has.
HOST_ACCOUNT = "agentsandbox"
FALLBACK_HOST_ID = 2_100_000_000
# Where the outer bwrap of a root worker stages what the inner one binds: a tmpfs over
# /sys (the sandbox never sees /sys, and it exists on every Linux host).
STAGE = "/sys"
# Host-wide files under the sandbox's own /proc: read-only (writes would change the
# host's kernel settings, or trigger sysrq, whatever the sandbox's uid).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)
PROC_READ_ONLY = (
    "sys",
    "sysrq-trigger",
    "irq",
    "bus",
    "fs",
    "pressure",
    "acpi",
    "scsi",
    "driver",
    "tty",
    "kcore",
    "keys",
    "timer_list",
)
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


def host_identity() -> tuple[int, int]:
    """The host uid and gid of every sandboxed command when the worker runs as root."""
    uid, gid = settings.SANDBOX_HOST_UID, settings.SANDBOX_HOST_GID
    if uid < 0:
        try:
            account = pwd.getpwnam(HOST_ACCOUNT)
            uid, gid = account.pw_uid, (account.pw_gid if gid < 0 else gid)
        except KeyError:
            uid = FALLBACK_HOST_ID
    return uid, (uid if gid < 0 else gid)


def drops_privilege() -> bool:
    """Whether commands must be switched to an unprivileged host uid (root worker)."""
    return os.geteuid() == 0


def hand_over(root: Path, uid: int, gid: int) -> None:
    """Make the working copy the sandbox user's: everything not yet owned by ``uid``
    (what the worker wrote as root) is given to it. The walk goes by directory
    descriptors opened with O_NOFOLLOW, so a link never leads it out of the copy."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(root, flags)
    pending = [top]
    if os.fstat(top)[4:6] != (uid, gid):
        os.fchown(top, uid, gid)
    while pending:
        directory = pending.pop()
        try:
            for entry in os.scandir(directory):
                try:
                    info = entry.stat(follow_symlinks=False)
                    if (info.st_uid, info.st_gid) != (uid, gid):
                        os.chown(entry.name, uid, gid, dir_fd=directory, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(os.open(entry.name, flags, dir_fd=directory))
                except OSError:
                    continue
        finally:
            os.close(directory)


class BubblewrapBackend(SandboxBackend):
    name = "bubblewrap"
    contains = True
    workdir_inside = "/workspace"

    def __init__(self) -> None:
        self.bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        # launcher pid -> (its cgroup, its output, the memory limit)
        self._running: dict[int, tuple[cgroups.CommandCgroup, IO[bytes], int]] = {}

    def problems(self) -> list[str]:
        found = []
        if not os.access(self.bwrap, os.X_OK):
            found.append("bwrap is not installed (apt-get install bubblewrap)")
        for tool in (PRLIMIT, SETPRIV):
            if not os.access(tool, os.X_OK):
                found.append(f"{tool} is missing (Debian package util-linux)")
        found += user_namespace_problems()
        if drops_privilege() and 0 in host_identity():
            found.append(
                "the worker runs as root and SANDBOX_HOST_UID/SANDBOX_HOST_GID name root: "
                "sandboxed commands would be host root"
            )
        cgroup_problem = cgroups.problem()
        if cgroup_problem:
            found.append(cgroup_problem)
        return found or self._probe()

    def _probe(self) -> list[str]:
        """Start one real sandbox: what the settings allow, the kernel may still refuse
        (an AppArmor or seccomp policy of the host, a read-only cgroup tree)."""
        root = Path(settings.SANDBOX_ROOT)
        root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=".probe-", dir=root))
        spec = CommandSpec(
            argv=["/bin/sh", "-c", "cat /proc/self/uid_map"],
            workdir=workdir,
            env={"PATH": "/usr/bin:/bin"},
            limits=Limits(cpu_seconds=10, memory_bytes=64 * 1024**2, file_size_bytes=1024**2),
        )
        try:
            with tempfile.TemporaryFile() as output:
                process = self.start(spec, output)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
                finally:
                    self.kill(process)
                output.seek(0)
                said = output.read(2000).decode(errors="replace").strip()
        except OSError as exc:
            return [f"a sandbox could not be started ({exc})"]
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        fields = said.split()
        if process.returncode != 0 or len(fields) != 3:
            return [f"a sandbox could not be started (bwrap said: {said[-500:]!r})"]
        if fields[1] == "0" and os.geteuid() == 0:
            return ["a sandboxed command ran as host root"]
        return []

    def argv(self, spec: CommandSpec, seccomp_fd: int | None = None) -> list[str]:
        """The whole launch: the sandbox itself, behind the outer step of a root worker.
        ``seccomp_fd`` is an inherited descriptor to read the seccomp filter from."""
        seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        if not drops_privilege():
            identity = _identity_files()
            return self._inner(spec, str(spec.workdir), spec.readonly_mounts, identity, seccomp)
        uid, gid = host_identity()
        staged = {rel: Path(f"{STAGE}/ro{i}") for i, rel in enumerate(sorted(spec.readonly_mounts))}
        outer = [self.bwrap, "--die-with-parent", "--dev-bind", "/", "/", "--tmpfs", STAGE]
        outer += ["--bind", str(spec.workdir), f"{STAGE}/workspace"]
        for relative, target in staged.items():
            outer += ["--ro-bind", str(spec.readonly_mounts[relative]), str(target)]
        for name, source in zip(("passwd", "group"), _identity_files(), strict=True):
            outer += ["--ro-bind", source, f"{STAGE}/{name}"]
        outer += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        outer += ["--", SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        outer += ["--inh-caps=-all", "--"]
        identity = (f"{STAGE}/passwd", f"{STAGE}/group")
        return outer + self._inner(spec, f"{STAGE}/workspace", staged, identity, seccomp)

    def _inner(
        self,
        spec: CommandSpec,
        workdir: str,
        readonly_mounts: dict[str, Path],
        identity: tuple[str, str],
        seccomp: list[str],
    ) -> list[str]:
        limits = spec.limits
        args = [
            self.bwrap,
            *seccomp,
            "--unshare-all",
            "--unshare-user",
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
            identity[0],
            "/etc/passwd",
            "--ro-bind",
            identity[1],
            "/etc/group",
        ]
        if spec.network:
            for name in ETC_NETWORK:
                if (Path("/etc") / name).exists():
                    args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc"]
        for name in PROC_READ_ONLY:
            args += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
        # /dev: a few device nodes, read-only; its one writable place is a sized tmpfs. Not
        # bwrap's --dev: its devpts needs a nested user namespace with root mapped.
        args += ["--tmpfs", "/dev"]
        for name in DEVICES:
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
        for name, target in DEV_LINKS:
            args += ["--symlink", target, f"/dev/{name}"]
        args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm"]  # noqa: S108
        args += ["--remount-ro", "/dev"]
        args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]  # noqa: S108
        args += ["--bind", workdir, self.workdir_inside]
        for relative, source in sorted(readonly_mounts.items()):
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
            f"--cpu={limits.cpu_seconds}",
            f"--fsize={limits.file_size_bytes}",
            "--core=0",
            "--",
            *command,
        ]
        return args

    def start(self, spec: CommandSpec, output: IO[bytes]) -> subprocess.Popen[bytes]:
        limits = spec.limits
        if drops_privilege():
            hand_over(spec.workdir, *host_identity())
        try:
            cgroup = cgroups.CommandCgroup.create(
                memory_bytes=limits.memory_bytes, processes=limits.processes, cpus=limits.cpus
            )
        except OSError as exc:
            raise ContainmentUnavailable(f"no cgroup for the command: {exc}") from exc
        program = seccomp.no_user_namespaces_filter()
        seccomp_fd = None
        if program is not None:
            seccomp_fd, writer = os.pipe()
            os.write(writer, program)  # far below a pipe's capacity
            os.close(writer)
        try:
            process = subprocess.Popen(
                self.argv(spec, seccomp_fd),
                # The launcher's own environment: nothing but a PATH (see the module doc).
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                # In the child before exec: bwrap and all it starts are born in the cgroup.
                preexec_fn=cgroup.enter,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
        except BaseException:
            cgroup.remove()
            raise
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        self._running[process.pid] = (cgroup, output, limits.memory_bytes)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        # bwrap's init dies with bwrap (--die-with-parent), and the kernel kills every
        # process of a pid namespace whose init died; the cgroup catches any straggler.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        running = self._running.pop(process.pid, None)
        if running is None:
            return
        cgroup, output, memory_bytes = running
        cgroup.kill()
        killed = cgroup.oom_kills()
        if killed:
            # The agent reads this in the command's output: why its processes vanished.
            note = (
                f"\n[sandbox: the memory limit of {memory_bytes} bytes was reached; "
                f"{killed} process(es) killed]\n"
            )
            # At the offset the command's own writes left (the file description is shared).
            with contextlib.suppress(OSError, ValueError):
                os.write(output.fileno(), note.encode())
        cgroup.remove()


def user_namespace_problems() -> list[str]:
    """Why an unprivileged user could not create the sandbox's user namespace."""
    found = []
    for name, bad in (
        ("user/max_user_namespaces", "0"),
        ("kernel/unprivileged_userns_clone", "0"),
        ("kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        with contextlib.suppress(OSError):
            if (Path("/proc/sys") / name).read_text().strip() == bad:
                found.append(
                    f"unprivileged user namespaces are off (sysctl {name.replace('/', '.')}="
                    f"{bad}); bwrap needs them (or an AppArmor profile allowing bwrap)"
                )
    return found


def cgroups_sweep(*, min_age_seconds: float = 300) -> int:
    return cgroups.cgroups_sweep(min_age_seconds=min_age_seconds)
