"""Children die with their supervisor, and a sweep stops only what a dead supervisor
recorded: never a process that got a recorded pid later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentplatform import supervision
from agentplatform.proc import group_members, start_time
from tests.conftest import wait_for

pytestmark = pytest.mark.no_services


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_a_spawned_child_dies_when_its_supervisor_is_sigkilled(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from agentplatform import supervision
        child = supervision.spawn(["sleep", "300"])
        print(child.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert start_time(child) is not None
    parent.kill()
    parent.wait()
    wait_for(lambda: start_time(child) is None, timeout=5, message="the child to die")


def test_sweep_stops_the_groups_of_a_dead_owner_and_keeps_a_live_owners(tmp_path: Path) -> None:
    orphan, kept = sleeper(), sleeper()
    try:
        (tmp_path / "serve-1.json").write_text(
            json.dumps(
                {
                    "owner": {"pid": os.getpid(), "start": 1},  # this pid, another start
                    "children": {
                        "worker": {"pid": orphan.pid, "start": start_time(orphan.pid)}
                        | {"group": True, "signal": int(signal.SIGTERM)}
                    },
                }
            )
        )
        live = supervision.PidFile(tmp_path, "serve")
        live.add("worker", kept.pid)
        assert supervision.sweep(tmp_path) == 1
        assert orphan.wait(timeout=5) == -signal.SIGTERM
        assert kept.poll() is None
        assert not (tmp_path / "serve-1.json").exists()
        assert live.path.exists()
    finally:
        for process in (orphan, kept):
            process.kill()
            process.wait()


def test_a_pid_with_another_start_time_is_never_signalled(tmp_path: Path) -> None:
    stranger = sleeper()
    try:
        record = {"pid": stranger.pid, "start": (start_time(stranger.pid) or 0) - 1}
        assert supervision.children_stop([record | {"group": True}], timeout=0.5) == 0
        assert supervision.children_stop([record | {"group": False}], timeout=0.5) == 0
        assert stranger.poll() is None
        assert group_members(stranger.pid) == [stranger.pid]
    finally:
        stranger.kill()
        stranger.wait()
