"""Cancelling a run during a long command kills the command's whole process group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from runs.agent.sandbox import sandbox_for_run
from runs.models import Run, ToolCall
from runs.services import run_cancel_request, task_submit
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_cancel_during_a_long_command_kills_it(workspace, repository, start_worker, tmp_path):
    pids = tmp_path / "pids"
    slow = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '120'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{__import__(\"os\").getpid()}} {{child.pid}}')\n"
        "time.sleep(120)\n"
    )
    script = {
        "turns": [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "slow.py", "content": slow}}
                ]
            },
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": f"{sys.executable} slow.py"}}
                ]
            },
        ]
    }
    start_worker()
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )
    run = submission.run
    wait_for(
        lambda: pids.exists() and pids.read_text().strip(),
        timeout=60,
        message="the long command to start",
    )
    parent, child = (int(p) for p in pids.read_text().split())
    assert _alive(parent) and _alive(child)
    requested = time.monotonic()

    assert run_cancel_request(run=run, by="alice", reason="changed my mind") is True

    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED,
        timeout=30,
        message="the run to end cancelled",
    )
    assert time.monotonic() - requested < 15
    wait_for(
        lambda: not _alive(parent) and not _alive(child),
        timeout=5,
        message="the command's processes to die",
    )
    run.refresh_from_db()
    assert run.failure_reason == "cancelled"
    call = ToolCall.objects.get(run=run, tool="run_command")
    assert (call.status, call.error) == ("failed", "stopped: run cancelled")
    types = list(run.events.values_list("type", flat=True))
    assert "agent.run.cancel.requested" in types and "agent.run.cancelled" in types
    wait_for(
        lambda: not sandbox_for_run(run.id).exists(),
        timeout=10,
        message="the sandbox to be removed",
    )
