"""`make demo`'s commands on the embedded default: nothing configured, so the platform
starts its own PostgreSQL and Valkey under var/, a real worker and beat run the task,
and the demo stops every server when it ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentplatform import embedded
from tests.agentplatform.test_embedded_default_stack import (
    ROOT,
    manage,
    server_pids,
    unconfigured_env,
)

pytestmark = [pytest.mark.no_services, pytest.mark.slow]


def test_demo_completes_a_run_on_its_own_postgresql_and_valkey(embedded_var):
    var = embedded_var
    env = unconfigured_env(var)
    manage(env, "migrate", "-v", "0")
    # migrate started the servers and left them for the next command.
    state = json.loads((var / "embedded.json").read_text())
    assert embedded.running(var) is not None
    demo = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "run completed" in demo.stdout
    assert "agent.pr.created" in demo.stdout
    assert (var / "postgres" / "PG_VERSION").exists()
    assert not (var / "agentplatform.sqlite3").exists()
    assert not (var / "broker").exists()
    # The demo held the servers and stopped them as it ended.
    assert not server_pids(var)
    assert not embedded._alive(state["postgres"]["pid"])
    assert not embedded._alive(state["redis"]["pid"])
