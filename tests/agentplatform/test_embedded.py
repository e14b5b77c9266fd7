"""The embedded services' supervisor: started once per directory and shared, servers that
run unprivileged when the caller is root, an owner that stops them, and servers left
behind by a dead owner or a deleted data directory stopped at the next start."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import redis

from agentplatform import embedded
from tests.agentplatform.test_embedded_default_stack import server_pids
from tests.conftest import wait_for

pytestmark = [pytest.mark.no_services, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(embedded_var: Path) -> Path:
    return embedded_var


def _owner(pid: int) -> str:
    return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name


def _ensure_in_process(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentplatform.embedded", "start", str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_started_once_and_shared_by_every_process(root: Path) -> None:
    # Three processes at once: one starts the servers, the others wait on the lock and
    # find them.
    starters = [_ensure_in_process(root) for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in starters]
    assert all(p.returncode == 0 for p in starters), outputs
    assert len(set(outputs)) == 1, outputs
    assert len(server_pids(root)) >= 2

    started = time.monotonic()
    endpoints = embedded.ensure(root)
    assert time.monotonic() - started < 0.2  # found, not started
    assert f"DATABASE_URL={endpoints.database_url}" in outputs[0]

    with psycopg.connect(endpoints.database_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("agentplatform",)
    assert redis.Redis.from_url(endpoints.redis_url).ping()


@pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged account is for root")
def test_as_root_the_servers_run_as_an_unprivileged_account(root: Path) -> None:
    embedded.ensure(root)
    state = embedded._state_read(root)
    for name in ("postgres", "redis"):
        assert _owner(state[name]["pid"]) == embedded.SERVICE_ACCOUNT
        assert pwd.getpwnam(embedded.SERVICE_ACCOUNT).pw_uid != 0
        assert (root / name).stat().st_uid == pwd.getpwnam(embedded.SERVICE_ACCOUNT).pw_uid


def test_the_owner_stops_them_and_no_one_else(root: Path) -> None:
    embedded.ensure(root)
    with embedded.held(root) as stops:
        assert stops
        # A second holder (another serve) while the first lives: not the owner.
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from agentplatform import embedded; "
                "sys.exit(0 if embedded.claim(Path(sys.argv[1])) else 3)",
                str(root),
            ],
            cwd=ROOT,
            timeout=60,
        )
        assert other.returncode == 3
        assert embedded.running(root) is not None
    assert embedded.running(root) is None
    assert not server_pids(root)


def test_the_servers_of_a_dead_owner_are_stopped(root: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from agentplatform import embedded; "
            "embedded.ensure(Path(sys.argv[1]), own=True); print('up', flush=True); "
            "time.sleep(600)",
            str(root),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None and owner.stdout.readline().strip() == "up"
    assert embedded.orphans_stop([root]) == []  # its owner lives
    owner.send_signal(signal.SIGKILL)  # as a killed `make serve` or test run
    owner.wait()
    assert embedded.running(root) is not None  # the servers outlived it
    assert embedded.orphans_stop([root]) == [root]
    assert not server_pids(root)


def test_servers_of_a_deleted_data_directory_are_stopped_at_the_next_start(
    root: Path,
) -> None:
    embedded.ensure(root)
    before = embedded._state_read(root)
    subprocess.run(["rm", "-rf", str(root)], check=True)  # `rm -rf var` while they run
    assert embedded._alive(before["postgres"]["pid"])
    embedded.ensure(root)
    assert not embedded._alive(before["postgres"]["pid"])
    assert not embedded._alive(before["redis"]["pid"])
    assert embedded.running(root) is not None


def test_a_server_that_died_is_started_again(root: Path) -> None:
    first = embedded.ensure(root)
    pid = embedded._state_read(root)["redis"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not embedded._alive(pid), timeout=10, message="Valkey dead")
    again = embedded.ensure(root)
    assert again.database_url == first.database_url
    assert redis.Redis.from_url(again.redis_url).ping()
