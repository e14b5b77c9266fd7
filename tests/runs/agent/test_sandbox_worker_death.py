"""Nothing a command started outlives the worker that started it: a SIGKILLed worker,
a soft time limit raised into the waiting worker. The next attempt works in a fresh
directory, so its patch holds only its own writes."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from runs import demo
from runs.agent.sandbox import LocalSandbox, run_workdirs
from runs.models import Patch, Run
from runs.reaper import zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import processes_with, wait_for


def _ticker(token: str) -> str:
    # Writes 12 ticks, one every 0.3 s, with a grandchild holding the token too.
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen(['sleep', '{token}'])\n"
        "for i in range(12):\n"
        "    with open('ticks.txt', 'a') as f:\n"
        "        f.write(f'tick {i}\\n')\n"
        "    time.sleep(0.3)\n"
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_sigkilled_worker_leaves_no_process_and_the_next_patch_has_only_its_writes(
    workspace, repository, start_worker
):
    token = f"{uuid.uuid4().int % 10**6}.75"
    script = demo.fix_script()
    script["turns"][2:2] = [
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "ticker.py", "content": _ticker(token)},
                }
            ]
        },
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": f"python3 ticker.py {token}"}}
            ]
        },
    ]
    doomed = start_worker("doomed")
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": script},
    )
    run = submission.run
    wait_for(lambda: len(processes_with(token)) >= 2, timeout=60, message="the ticker to run")
    time.sleep(0.5)
    doomed.kill()

    # die-with-parent and the pid namespace: the whole tree goes with the worker.
    wait_for(lambda: not processes_with(token), timeout=5, message="the command's processes to die")
    start_worker("successor")
    wait_for(lambda: zombies_reap().recovered, timeout=30, interval=0.5, message="recovery")

    def ended() -> bool:
        run.refresh_from_db()
        return run.status in TERMINAL

    wait_for(ended, timeout=120, message="the run to end")
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    diff = Patch.objects.get(run=run).diff_artifact.content
    ticks = [line[1:] for line in diff.splitlines() if line.startswith("+tick ")]
    assert ticks == [f"tick {i}" for i in range(12)], ticks
    # The worker removes them right after the terminal commit this test just observed.
    wait_for(lambda: not run_workdirs(run.id), timeout=10, message="the working copies to go")


@pytest.mark.no_services
def test_a_soft_time_limit_during_a_command_kills_its_tree(tmp_path, settings):
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    box = LocalSandbox("run-soft-1")
    box.create()
    token = f"{uuid.uuid4().int % 10**6}.5"
    (box.path / "long.py").write_text(
        f"import subprocess, time\nsubprocess.Popen(['sleep', '{token}'])\ntime.sleep({token})\n"
    )

    def soft_limit(signum, frame):  # what Celery does on a task's soft time limit
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, soft_limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        with pytest.raises(SoftTimeLimitExceeded):
            box.run(["python3", "long.py", token], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    wait_for(lambda: not processes_with(token), timeout=5, message="the tree to die")
