"""The host's CPU slots: never more sandboxed commands at once than SANDBOX_CPU_SLOTS,
counted at the sandbox (real bubblewrap processes), from several worker processes and
threads at once; a command waiting for a slot stops when its run is cancelled."""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from pathlib import Path

import pytest

from runs.agent import slots
from runs.agent.sandbox import CommandCancelled, CommandResult, LocalSandbox
from tests.chaos.services import live_processes

pytestmark = pytest.mark.no_services

PROCESSES = 2
THREADS = 3
LIMIT = 2


def _commands_running(token: bytes) -> int:
    """Interpreters running the token's command (bubblewrap's own processes left out)."""
    return sum(
        1
        for _, _, cmdline in live_processes()
        if token in cmdline and cmdline.split(b"\0", 1)[0].endswith(b"python3")
    )


def _commands_run(name: str, token: str, results: list[CommandResult]) -> None:
    threads = []
    for n in range(THREADS):
        box = LocalSandbox(f"slots-{name}-{n}")
        box.create()

        def run(box: LocalSandbox = box) -> None:
            results.append(box.run(["python3", "-c", "import time; time.sleep(0.8)", token]))

        threads.append(threading.Thread(target=run))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _worker_process(name: str, token: str, failures: multiprocessing.Queue) -> None:
    results: list[CommandResult] = []
    _commands_run(name, token, results)
    failures.put(sum(1 for r in results if not r.ok) + THREADS - len(results))


@pytest.fixture
def slot_settings(settings, tmp_path: Path):
    settings.SANDBOX_CPU_SLOTS = LIMIT
    settings.SANDBOX_CPU_SLOTS_DIR = tmp_path / "cpu-slots"
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    return settings


def test_never_more_sandboxed_commands_at_once_than_the_slots(slot_settings):
    token = f"slot-{uuid.uuid4().hex}"
    failures: multiprocessing.Queue = multiprocessing.Queue()
    fork = multiprocessing.get_context("fork")
    workers = [
        fork.Process(target=_worker_process, args=(f"p{n}", token, failures))
        for n in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    peak = seen = 0
    while any(worker.is_alive() for worker in workers):
        running = _commands_running(token.encode())
        peak = max(peak, running)
        seen += running
        time.sleep(0.02)
    for worker in workers:
        worker.join()

    assert [failures.get(timeout=5) for _ in workers] == [0, 0]
    assert seen > 0, "no command was ever seen running"
    # Six commands from two processes of three threads each: at most two at a time, and
    # the limit is reached (the slots are shared, not one per process).
    assert peak == LIMIT


def test_a_command_waiting_for_a_slot_stops_when_its_run_is_cancelled(slot_settings):
    slot_settings.SANDBOX_CPU_SLOTS = 1
    box = LocalSandbox("slots-waiting")
    box.create()
    stop = threading.Event()
    with slots.cpu_slot():  # every slot is taken
        threading.Timer(0.3, stop.set).start()
        with pytest.raises(CommandCancelled):
            box.run(["python3", "-c", "print('never')"], should_stop=stop.is_set)
    # The slot was given back: the next command runs.
    assert box.run(["python3", "-c", "print('ran')"]).output.strip() == "ran"
