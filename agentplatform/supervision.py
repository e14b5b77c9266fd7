"""Children that die with the process that started them, however it ends.

``make serve``, ``make demo``, the benchmark and the chaos runner start web servers,
workers, beat and servers of their own. Three layers make sure none outlives them:

- ``spawn``: each child leads a session of its own (so Ctrl-C on the terminal reaches the
  supervisor once, and it stops each child's whole group in order) and gets SIGTERM from
  the kernel when the supervisor dies, even by SIGKILL (``PR_SET_PDEATHSIG``; it fires
  when the thread that forked exits, so spawn from the main thread).
- ``Watchdog``: a small process of the same kind that outlives the supervisor by a few
  seconds: on its parent's death it stops, by process group, everything recorded in the
  supervisor's pid file (children that ignored the parent-death signal, servers that
  daemonised away from it) and, for ``make serve`` and ``make demo``, the embedded
  PostgreSQL and Valkey when the dead process owned them.
- ``sweep``: at the next start, pid files under ``var/run/`` whose owner is gone are
  read and what they list is stopped.

Every pid is recorded with its start time (``/proc/<pid>/stat``), and nothing is
signalled unless both match: a pid the kernel handed to another process since is never
signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agentplatform import embedded
from agentplatform.proc import group_members, same_process, start_time

PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_SECONDS = 5.0


def _die_with_parent(signum: int, parent: int) -> Callable[[], None]:
    # The signal fires when the forking *thread* ends: from a short-lived thread it would
    # stop the child early, so only the main thread arms it (the watchdog covers the rest).
    armed = threading.current_thread() is threading.main_thread()

    def preexec() -> None:
        os.setsid()
        if armed:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        # The parent may have died between fork and prctl: no signal would ever come.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def spawn(argv: list[str], *, death_signal: int = signal.SIGTERM, **kwargs: Any) -> Any:
    """``subprocess.Popen`` of a child in a session of its own that receives
    ``death_signal`` when this process dies."""
    kwargs.pop("start_new_session", None)
    return subprocess.Popen(argv, preexec_fn=_die_with_parent(death_signal, os.getpid()), **kwargs)


def die_with_make() -> None:
    """Under ``make`` (``make serve``, ``make chaos``...), stop as if by SIGTERM when make
    dies: a supervisor or CI job that kills make, even with SIGKILL, signals make alone and
    would leave this process running. Elsewhere (a shell, nohup, systemd) nothing
    changes."""
    try:
        parent = Path(f"/proc/{os.getppid()}/comm").read_text().strip()
    except OSError:
        return
    if parent in ("make", "gmake"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1 or not Path(f"/proc/{os.getppid()}/comm").exists():
            os.kill(os.getpid(), signal.SIGTERM)  # make died before the signal was armed


# --- pid files ------------------------------------------------------------------------------


class PidFile:
    """What a supervisor started, in ``var/run/<name>-<pid>.json``: its own pid and start
    time, and each child's (``group``: the child leads a process group to stop whole)."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}-{os.getpid()}.json"
        self.state: dict[str, Any] = {
            "owner": {"pid": os.getpid(), "start": start_time(os.getpid())},
            "children": {},
        }
        self._write()

    def _write(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.state))
        partial.replace(self.path)

    def add(self, name: str, pid: int, *, group: bool = True, signum: int = signal.SIGTERM) -> None:
        started = start_time(pid)
        self.state["children"][name] = {
            "pid": pid,
            "start": started,
            "group": group,
            "signal": int(signum),
        }
        self._write()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _targets(child: dict[str, Any]) -> list[int]:
    """The pids to signal for one recorded child: none unless the record still names it
    (its leader alive with the recorded start time, or, for a group whose leader is gone,
    members that started no earlier than it did)."""
    pid, started = child.get("pid"), child.get("start")
    if not pid or started is None:
        return []
    leader = start_time(pid)
    if not child.get("group") or (leader is not None and leader != started):
        return [pid] if leader == started else []
    return [
        member
        for member in group_members(pid)
        if (member_start := start_time(member)) is not None and member_start >= started
    ]


def children_stop(children: Iterable[dict[str, Any]], timeout: float = STOP_TIMEOUT_SECONDS) -> int:
    """Signal each recorded child (and its group) that still is what was recorded; SIGKILL
    what remains after ``timeout``. The number of processes signalled."""
    signalled: dict[int, int] = {}
    for child in children:
        for pid in _targets(child):
            signalled[pid] = start_time(pid) or 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, int(child.get("signal") or signal.SIGTERM))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        start_time(pid) == started for pid, started in signalled.items()
    ):
        time.sleep(0.05)
    for pid, started in signalled.items():
        if start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return len(signalled)


def sweep(directory: Path) -> int:
    """Stop what the pid files in ``directory`` list for owners that are gone (a killed
    ``make serve``, say) and remove those files; the number of processes signalled."""
    if not directory.is_dir():
        return 0
    signalled = 0
    for path in directory.glob("*.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = state.get("owner", {})
        if same_process(owner.get("pid"), owner.get("start")):
            continue
        signalled += children_stop(state.get("children", {}).values())
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return signalled


# --- the watchdog ----------------------------------------------------------------------------


class Watchdog:
    """``python -m agentplatform.supervision watch PIDFILE [--embedded DIR]``, started by
    the supervisor with ``spawn``: waits for the supervisor's death, then stops what
    its pid file lists (and, with ``--embedded``, the embedded services the dead
    supervisor owned). On a clean exit the supervisor stops its children first, so
    the watchdog finds nothing left to stop."""

    def __init__(self, pid_file: PidFile, *, embedded_root: Path | None = None) -> None:
        argv = [sys.executable, "-m", "agentplatform.supervision", "watch", str(pid_file.path)]
        if embedded_root is not None:
            argv += ["--embedded", str(embedded_root)]
        self.process = spawn(argv, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        """End the watchdog after a clean stop (its work is done)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _watch(path: Path, embedded_root: Path | None) -> int:
    parent = os.getppid()
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    while True:
        # The parent-death signal, or the parent gone before it was armed; a signal of
        # someone else's while the supervisor lives is not its death.
        while os.getppid() == parent and signal.sigtimedwait(stops, 1.0) is None:
            pass
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        owner = state.get("owner", {})
        if os.getppid() != parent or not same_process(owner.get("pid"), owner.get("start")):
            break
    children_stop(state.get("children", {}).values())
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if embedded_root is not None:
        embedded.orphans_stop([embedded_root])
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "watch":
        print("usage: python -m agentplatform.supervision watch PIDFILE [--embedded DIR]")
        return 2
    embedded_root = Path(argv[3]) if len(argv) > 3 and argv[2] == "--embedded" else None
    return _watch(Path(argv[1]), embedded_root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
