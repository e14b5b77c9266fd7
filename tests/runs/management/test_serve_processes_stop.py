"""`make serve` on the embedded default leaves nothing running when it ends, however it
ends: Ctrl-C on an idle serve stops every child within 5 s, and a serve killed with
SIGKILL (as a supervisor's or a test harness's last resort does) takes its web server,
worker, beat and the embedded PostgreSQL and Valkey it owned with it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from agentplatform import embedded
from agentplatform.proc import group_members, start_time
from tests.agentplatform.test_embedded_default_stack import manage, server_pids, unconfigured_env
from tests.chaos.services import live_processes
from tests.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.no_services, pytest.mark.slow]


def descendants_of_serve(state: dict[str, dict[str, int]]) -> list[int]:
    """Live processes of the groups serve's children lead (web, worker and its pool,
    beat)."""
    return [pid for child in state.values() for pid in group_members(child["pid"])]


def serve_children(var: Path, serve: subprocess.Popen[str] | Any) -> dict[str, dict[str, int]]:
    """web, worker and beat of ``serve``, from its process tree."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) != serve.pid:
            continue
        if b"uvicorn" in cmdline:
            children["web"] = {"pid": int(entry.name)}
        elif b"worker" in cmdline:
            children["worker"] = {"pid": int(entry.name)}
        elif b"beat" in cmdline:
            children["beat"] = {"pid": int(entry.name)}
    return children


@pytest.fixture
def serving(tmp_path: Path, embedded_var: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    env = unconfigured_env(embedded_var)
    manage(env, "migrate", "-v", "0")
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            return False

    children: dict[str, dict[str, int]] = {}
    try:
        wait_for(healthy, timeout=120, interval=0.3, message="serve answering")
        children = wait_for(
            lambda: (found := serve_children(embedded_var, serve)) and len(found) == 3 and found,
            timeout=30,
            message="web, worker and beat",
        )
        # The worker idle: ready, its start-up tasks done.
        wait_for(
            lambda: b"ready." in (tmp_path / "serve.log").read_bytes(),
            timeout=60,
            message="worker ready",
        )
        time.sleep(2)
        yield serve, embedded_var
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        for child in children.values():
            for pid in group_members(child["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        log.close()


def test_ctrl_c_on_an_idle_serve_stops_every_child_within_5_seconds(serving) -> None:
    serve, var = serving
    children = serve_children(var, serve)
    assert set(children) == {"web", "worker", "beat"}
    os.killpg(serve.pid, signal.SIGINT)
    started = time.monotonic()
    wait_for(
        lambda: not descendants_of_serve(children), timeout=10, interval=0.05, message="children"
    )
    assert time.monotonic() - started < 5
    assert serve.wait(timeout=30) == 0
    assert not server_pids(var)


def test_a_serve_killed_with_sigkill_leaves_no_process_behind(serving) -> None:
    serve, var = serving
    children = serve_children(var, serve)
    state = json.loads((var / "embedded.json").read_text())
    assert server_pids(var)

    # A supervisor's stop: SIGTERM, then SIGKILL 2 s later, to serve alone.
    serve.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    serve.send_signal(signal.SIGKILL)
    serve.wait()

    wait_for(
        lambda: not descendants_of_serve(children),
        timeout=15,
        interval=0.1,
        message=f"serve's children to stop: {descendants_of_serve(children)}",
    )
    wait_for(
        lambda: not server_pids(var),
        timeout=30,
        interval=0.1,
        message=f"the embedded servers to stop: {server_pids(var)}",
    )
    assert not embedded._alive(state["postgres"]["pid"])
    assert not embedded._alive(state["redis"]["pid"])


def test_a_serve_killed_with_sigkill_while_idle_leaves_no_process_behind(serving) -> None:
    serve, var = serving
    children = serve_children(var, serve)
    os.kill(serve.pid, signal.SIGKILL)
    serve.wait()
    wait_for(
        lambda: not descendants_of_serve(children),
        timeout=15,
        interval=0.1,
        message=f"serve's children to stop: {descendants_of_serve(children)}",
    )
    wait_for(lambda: not server_pids(var), timeout=30, interval=0.1, message="embedded servers")


def test_serves_worker_stops_on_sigterm_within_seconds(serving) -> None:
    serve, var = serving
    worker = serve_children(var, serve)["worker"]
    pool = group_members(worker["pid"])
    assert len(pool) >= 3  # the main process and its two pool processes
    # SIGTERM to the worker's main process alone, as `kill PID` or a supervisor sends it.
    os.kill(worker["pid"], signal.SIGTERM)
    started = time.monotonic()
    wait_for(lambda: not group_members(worker["pid"]), timeout=10, interval=0.05, message="worker")
    assert time.monotonic() - started < 5


def test_make_serve_killed_with_sigkill_leaves_no_process_behind(
    tmp_path: Path, embedded_var: Path
) -> None:
    """A supervisor kills `make` itself, not the Python process make started."""
    port = free_port()
    env = unconfigured_env(embedded_var, PORT=str(port))
    log = open(tmp_path / "make.log", "w")  # noqa: SIM115 - closed below
    make = subprocess.Popen(
        ["make", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    serve_pid = 0
    try:

        def serve_answers() -> bool:
            assert make.poll() is None, (tmp_path / "make.log").read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).is_success
            except httpx.HTTPError:
                return False

        wait_for(serve_answers, timeout=240, interval=0.5, message="make serve answering")
        serve_pid = next(
            pid
            for pid, fields, cmdline in live_processes()
            if int(fields[1]) == make.pid and b"serve" in cmdline
        )
        children = wait_for(
            lambda: serve_children(embedded_var, SimpleNamespace(pid=serve_pid)), timeout=30
        )
        make.kill()
        make.wait()
        wait_for(
            lambda: not descendants_of_serve(children) and start_time(serve_pid) is None,
            timeout=30,
            interval=0.1,
            message="serve and its children to stop",
        )
        wait_for(lambda: not server_pids(embedded_var), timeout=30, message="embedded servers")
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
        if serve_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(serve_pid, signal.SIGKILL)
        log.close()
