"""Cancelling a run during a long command kills the command's whole process group."""

from __future__ import annotations

import time
import uuid

import pytest

from runs.agent.sandbox import run_workdirs
from runs.models import Run, ToolCall
from runs.services import run_cancel_request, task_submit
from tests.conftest import processes_with, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_cancel_during_a_long_command_kills_it(workspace, repository, start_worker):
    # The sandbox has its own pid namespace: the test finds the command's processes on
    # the host by a token in their command lines.
    token = f"{uuid.uuid4().int % 10**6}.25"
    slow = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '{token}'])\n"
        "open('started', 'w').write('yes')\n"
        f"time.sleep({token})\n"
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
                    {"name": "run_command", "arguments": {"command": f"python3 slow.py {token}"}}
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
        lambda: any((path / "started").exists() for path in run_workdirs(run.id)),
        timeout=60,
        message="the long command to start",
    )
    wait_for(lambda: len(processes_with(token)) >= 2, timeout=10, message="both processes")
    requested = time.monotonic()

    assert run_cancel_request(run=run, by="alice", reason="changed my mind") is True

    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED,
        timeout=30,
        message="the run to end cancelled",
    )
    assert time.monotonic() - requested < 15
    wait_for(
        lambda: not processes_with(token),
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
        lambda: not run_workdirs(run.id),
        timeout=10,
        message="the sandbox to be removed",
    )
