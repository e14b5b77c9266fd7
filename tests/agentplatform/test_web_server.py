"""The production web server (``python -m agentplatform.web``): each worker listens on a
socket of its own, so connections are spread over the workers; a worker that dies is
replaced; SIGTERM stops them all; an address in use fails at once.

``uvicorn --workers 2`` shares one socket between its workers, and the worker the
kernel wakes accepts every connection pending: 32 connections opened at once landed
32/0, 25/7 and 23/9 on its two workers. The servers here are real processes; which
worker holds a connection is read from ``/proc`` (the socket's inode in the worker's
file descriptors, its state and ports in ``/proc/net/tcp``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.chaos.services import live_processes
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def _children(pid: int) -> list[int]:
    """The live worker processes of the server ``pid`` (not multiprocessing's helper)."""
    return sorted(
        child
        for child, fields, cmdline in live_processes()
        if int(fields[1]) == pid and b"spawn_main" in cmdline
    )


def _established_inodes(port: int) -> set[str]:
    """Inodes of the established TCP sockets whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":
                inodes.add(fields[9])
    return inodes


def connections_by_worker(pids: list[int], port: int) -> Counter[int]:
    inodes = _established_inodes(port)
    held: Counter[int] = Counter({pid: 0 for pid in pids})
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held[pid] += 1
    return held


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _wait(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _environment() -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentplatform.web", "--port", str(port), "--workers", "2"],
        cwd=ROOT,
        env=_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait(lambda: len(_children(process.pid)) == 2 and _answers(port), 60, "the workers")
        # Both workers listening: the socket group is complete.
        _wait(lambda: len(_listening(port)) == 2, 30, "both sockets")
        yield process, port
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)


def _listening(port: int) -> list[str]:
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
            found.append(fields[9])
    return found


def test_connections_opened_at_once_are_spread_over_the_workers(
    server: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = server
    workers = _children(process.pid)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
    try:
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        for client in clients:
            client.sendall(request)
        for client in clients:
            assert client.recv(64).startswith(b"HTTP/1.1 200")
        held = connections_by_worker(workers, port)
        assert sum(held.values()) == 32, held
        # A hash of 32 addresses over two sockets: fewer than 4 on one is a chance of
        # about one in 400,000.
        assert min(held.values()) >= 4, held
    finally:
        for client in clients:
            client.close()


def test_a_worker_that_dies_is_replaced(server: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = server
    before = _children(process.pid)
    os.kill(before[0], signal.SIGKILL)
    _wait(
        lambda: len(after := _children(process.pid)) == 2 and before[0] not in after,
        30,
        "a new worker",
    )
    _wait(lambda: len(_listening(port)) == 2, 30, "the new worker's socket")
    assert _answers(port)
    assert process.poll() is None


def test_sigterm_stops_every_worker(server: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = server
    workers = _children(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert not any(_alive(pid) for pid in workers)
    assert not _answers(port)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_address_in_use_fails_at_once() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = _serve_once(port)
    assert result.returncode == 3
    assert "Address already in use" in result.stderr
    assert time.monotonic() - started < 30


def test_a_second_server_on_the_same_address_does_not_join_the_first(
    server: tuple[subprocess.Popen[bytes], int],
) -> None:
    _, port = server
    result = _serve_once(port)
    assert result.returncode == 3
    assert "Address already in use" in result.stderr
    assert len(_listening(port)) == 2


def _serve_once(port: int) -> subprocess.CompletedProcess[str]:
    """A web server started on ``port`` (one worker), run until it exits by itself."""
    return subprocess.run(
        [sys.executable, "-m", "agentplatform.web", "--port", str(port), "--workers", "1"],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
