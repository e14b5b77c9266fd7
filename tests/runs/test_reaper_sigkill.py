"""Runs whose worker was SIGKILLed: the reaper recovers them (once, however many
reapers sweep) and fails them when their recoveries at one point are spent."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from runs import demo
from runs.models import Run
from runs.reaper import ReapReport, zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOW = {
    "content": "Thinking slowly.",
    "tool_calls": [
        {
            "name": "run_command",
            "arguments": {"command": "python3 -c \"__import__('time').sleep(4)\""},
        }
    ],
}


def _two_slow_steps() -> dict:
    script = demo.fix_script()
    script["turns"].insert(2, SLOW)
    script["turns"].insert(4, SLOW)
    return script


def _kill_during_act_turn(run: Run, worker, turn: int) -> None:
    def in_slow_turn() -> bool:
        run.refresh_from_db()
        return bool(
            run.status == Run.Status.RUNNING
            and run.lease_owner
            and run.model_turns.filter(purpose="act").count() >= turn
        )

    wait_for(in_slow_turn, timeout=60, message=f"act turn {turn} to start")
    worker.kill()


def _lease_expired(run: Run) -> bool:
    run.refresh_from_db()
    return run.lease_until is not None and run.lease_until < timezone.now()


def _reap_concurrently(count: int) -> list[ReapReport]:
    reports: list[ReapReport] = []
    barrier = threading.Barrier(count)

    def reap() -> None:
        try:
            barrier.wait()
            reports.append(zombies_reap())
        finally:
            connection.close()

    threads = [threading.Thread(target=reap) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return reports


def test_killed_worker_is_recovered_once_then_failed_when_recoveries_are_spent(
    workspace,
    repository,
    start_worker,
):
    first = start_worker("first")
    run = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": _two_slow_steps()},
    ).run
    _kill_during_act_turn(run, first, 3)
    wait_for(lambda: _lease_expired(run), timeout=15, message="the lease to expire")

    reports = _reap_concurrently(3)

    assert sum(r.recovered for r in reports) == 1
    run.refresh_from_db()
    assert (run.recoveries, run.retries) == (1, 0)  # a crash is not a retry
    assert run.lease_owner == "" and run.status == Run.Status.RUNNING
    types = list(run.events.values_list("type", flat=True))
    assert types.count("agent.run.heartbeat.missed") == 1
    assert types.count("agent.run.recovered") == 1

    # The step crashes its next worker at the same point (a poison step): no turn
    # answered since the recovery.
    second = start_worker("second")
    _kill_during_act_turn(run, second, 3)
    wait_for(lambda: _lease_expired(run), timeout=15, message="the lease to expire again")
    with override_settings(RUN_MAX_RECOVERIES=1):
        assert zombies_reap().failed == 1

    def ended() -> bool:
        run.refresh_from_db()
        return run.status in TERMINAL

    wait_for(ended, timeout=10, message="the run to end")
    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "recoveries_exhausted")
    run.task.refresh_from_db()
    assert run.task.status == "failed"
    assert run.events.filter(type="agent.run.failed").count() == 1
