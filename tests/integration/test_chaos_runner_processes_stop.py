"""The chaos runner, stopped mid-scenario however it is stopped, leaves nothing running:
killed with SIGKILL (a CI time limit), its PostgreSQL cluster, Redis, web server,
workers and beat stop with it; stopped with SIGTERM, it tears its stack down and says
so; out of budget, a FAIL line names the scenario that ran over."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.services import live_processes
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.no_services, pytest.mark.slow, pytest.mark.timeout(600)]


def stack_processes(runner_pid: int, root: str) -> list[str]:
    """Live processes of the runner's stack: its workers (named after the runner's pid),
    beat and Redis (their files under its directory), web (its port) and PostgreSQL
    (working in its data directory)."""
    found = []
    for pid, _, cmdline in live_processes():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if f"-{runner_pid}@".encode() in cmdline or root.encode() in cmdline or root in cwd:
            command = cmdline.replace(b"\0", b" ")[:120].decode(errors="replace")
            found.append(f"{pid} {command}")
    return found


@pytest.fixture
def chaos_runner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp_path / "chaos.log"
    with open(log, "w") as handle:
        runner = subprocess.Popen(
            [sys.executable, "-u", "-m", "tests.chaos", "--scenario", "worker-kill", "--light"],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            yield runner, log
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()


def stack_root(runner: subprocess.Popen[str], log: Path) -> str:
    def up() -> str | None:
        assert runner.poll() is None, log.read_text()[-3000:]
        found = re.search(r"logs in (\S+)/logs", log.read_text())
        return found.group(1) if found else None

    root = wait_for(up, timeout=240, interval=0.5, message="the chaos platform up")
    time.sleep(5)  # mid-scenario: runs submitted, workers being killed
    return str(root)


def test_chaos_runner_killed_mid_scenario_leaves_no_process(chaos_runner) -> None:
    runner, log = chaos_runner
    root = stack_root(runner, log)
    assert stack_processes(runner.pid, root)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    wait_for(
        lambda: not stack_processes(runner.pid, root),
        timeout=30,
        interval=0.2,
        message=f"the stack to stop: {stack_processes(runner.pid, root)}",
    )


def test_chaos_runner_stopped_with_sigterm_tears_its_stack_down(chaos_runner) -> None:
    runner, log = chaos_runner
    root = stack_root(runner, log)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 1
    assert "stopped by SIGTERM" in log.read_text()
    assert not stack_processes(runner.pid, root)


def test_a_scenario_over_its_budget_is_named_and_the_stack_torn_down(tmp_path: Path) -> None:
    """The full worker-kill scenario takes minutes; a 150 s budget leaves it about two
    after the platform's start."""
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--scenario", "worker-kill", "--budget", "150"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert completed.returncode == 1, completed.stdout[-3000:]
    assert time.monotonic() - started < 150 + 60
    failure = re.search(r"^FAIL (.*) ran over its budget", completed.stdout, re.M)
    assert failure, completed.stdout[-3000:]
    if "platform up" in completed.stdout:
        assert failure.group(1) == "scenario worker-kill"
    root = re.search(r"logs in (\S+)/logs", completed.stdout)
    if root:
        assert not stack_processes(0, root.group(1))
