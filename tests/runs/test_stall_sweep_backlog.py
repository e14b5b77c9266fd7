"""The stall sweep re-sends a lost wake-up, but never floods a queue that is only slow."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from runs.models import Run
from runs.services import run_recover_stalled
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _agent_depth(queue: redis.Redis) -> int:
    """Messages on the agent queue, in every one of its priority lists."""
    keys = ["agent", *(f"agent\x06\x16{step}" for step in range(1, 10))]
    return sum(queue.llen(key) for key in keys)


def test_stall_sweep_does_not_multiply_wakeups_of_waiting_runs(workspace, own_redis, broker_at):
    broker_at(own_redis.url)  # no worker listens there: every message stays queued
    long_ago = timezone.now() - timedelta(minutes=10)
    for _ in range(20):
        Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    Run.objects.update(heartbeat_at=long_ago)
    queue = redis.Redis.from_url(own_redis.url)
    stall = timedelta(seconds=30)

    depths = []
    for _ in range(5):
        run_recover_stalled(stall_after=stall)
        depths.append(_agent_depth(queue))
    assert depths == [20, 20, 20, 20, 20]

    # Still nobody took them after the first wait: one more each, then a longer wait.
    Run.objects.update(woken_at=timezone.now() - stall - timedelta(seconds=1))
    assert run_recover_stalled(stall_after=stall) == 0  # the second wait is twice as long
    Run.objects.update(woken_at=timezone.now() - 2 * stall - timedelta(seconds=1))
    assert run_recover_stalled(stall_after=stall) == 20
    assert run_recover_stalled(stall_after=stall) == 0
    assert _agent_depth(queue) == 40
    assert set(Run.objects.values_list("wakes", flat=True)) == {2}
