"""Processes the chaos harness owns: its own PostgreSQL and Redis, and supervised children.

Every process a scenario kills or restarts is started here, on a free port, in a private
directory, so a fault never reaches a service anyone else uses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from agentplatform import embedded, supervision

# The embedded default's server binaries (no system PostgreSQL or Redis needed).
PG_BIN = Path(os.environ.get("CHAOS_PG_BIN") or embedded.postgres_bin())
PG_USER = os.environ.get("CHAOS_PG_USER", embedded.SERVICE_ACCOUNT)
REDIS_SERVER = os.environ.get("CHAOS_REDIS_SERVER") or str(embedded.valkey_server())
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, timeout: float = 30, *, up: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port) == up:
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not come {'up' if up else 'down'} in {timeout}s")


class PostgresCluster:
    """A throwaway PostgreSQL cluster (trust auth, fsync off) in ``root``."""

    def __init__(self, root: Path, pid_file: supervision.PidFile | None = None) -> None:
        self.pid_file = pid_file
        self.root = root / "postgres"
        self.root.mkdir()
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "postgres.log"
        # PostgreSQL refuses to run as root: as root, the cluster belongs to the
        # unprivileged account the embedded servers run as.
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            if PG_USER == embedded.SERVICE_ACCOUNT:
                embedded.service_account()  # created on first use
            self.as_user = ["runuser", "-u", PG_USER, "--"]
            root.chmod(0o755)
            shutil.chown(self.root, PG_USER)
        subprocess.run(
            [
                *self.as_user,
                PG_BIN / "initdb",
                "-D",
                self.data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
            check=True,
            capture_output=True,
        )
        self.start()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/chaos"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, PG_BIN / "pg_ctl", "-D", self.data, *args],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300 "
            # When each model turn's checkpoint committed, for the endpoint invariant.
            "-c track_commit_timestamp=on"
        )
        self._ctl("-o", options, "-l", str(self.log), "-w", "-t", "60", "start")
        if self.pid_file is not None:
            # pg_ctl leaves the server detached: only the watchdog can stop it if the
            # harness is killed (SIGQUIT: immediate shutdown, the backends with it).
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
            self.pid_file.add("postgres", postmaster, group=False, signum=signal.SIGQUIT)

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "-t", "60", "stop")

    def create_database(self, name: str) -> None:
        subprocess.run(
            [PG_BIN / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
            check=True,
            capture_output=True,
        )

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")


class RedisServer:
    """A Redis with no persistence: a restart loses every queued message."""

    def __init__(self, root: Path, pid_file: supervision.PidFile | None = None) -> None:
        self.root = root
        self.pid_file = pid_file
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = supervision.spawn(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            death_signal=signal.SIGKILL,
        )
        log.close()
        if self.pid_file is not None:
            self.pid_file.add("redis", self.process.pid, signum=signal.SIGKILL)
        wait_port(self.port)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        wait_port(self.port, up=False)

    def destroy(self) -> None:
        self.kill()


class Child:
    """A supervised child in its own process group; exits the harness did not cause are
    counted (the invariant: no process exits unless killed) and the child is restarted."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log_dir: Path,
        pid_file: supervision.PidFile | None = None,
    ) -> None:
        self.name = name
        self.pid_file = pid_file
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.unexpected_exits: list[str] = []
        self.kills = 0

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        # Its own group, and SIGTERM from the kernel should the harness die.
        self.process = supervision.spawn(
            self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        if self.pid_file is not None:
            self.pid_file.add(self.name, self.process.pid)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Record and restart a child that exited on its own."""
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-600:].strip().splitlines()
            self.unexpected_exits.append(
                f"{self.name} exited with {self.process.returncode}: {tail[-1] if tail else ''}"
            )
            self.start()

    def signal_group(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole group (parent and pool): no cleanup, no acknowledgement."""
        if self.alive():
            self.signal_group(signal.SIGKILL)
            assert self.process is not None
            self.process.wait()
            self.kills += 1
        self._reap_group()

    def _reap_group(self) -> None:
        # Pool children may outlive a SIGKILLed parent for a moment; never leave one behind.
        deadline = time.monotonic() + 5
        while self.process is not None and group_members(self.process.pid):
            if time.monotonic() > deadline:
                break
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.05)

    def stop(self, timeout: float = 15) -> None:
        if self.alive():
            self.signal_group(signal.SIGTERM)
            assert self.process is not None
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.process.wait()
        self._reap_group()

    def cpu_seconds(self) -> float:
        """User + system CPU of every live process in the child's group."""
        if not self.alive():
            return 0.0
        total = 0
        for pid in group_members(self.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / CLOCK_TICKS


def live_processes() -> Iterator[tuple[int, list[str], bytes]]:
    """Every live process (zombies left out: they hold no CPU or port): its pid, the
    fields of its ``stat`` after the command name (``[0]`` the state, ``[1]`` the parent,
    ``[2]`` the process group) and its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            yield int(entry.name), fields, cmdline


def group_members(pgid: int) -> list[int]:
    return [pid for pid, fields, _ in live_processes() if int(fields[2]) == pgid]


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
