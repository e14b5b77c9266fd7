"""Leases are renewed by one heartbeat thread per process, not a thread per step."""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings
from django.utils import timezone

from runs import heartbeat as heartbeats
from runs.heartbeat import Heartbeat
from runs.lease import lease_acquire
from runs.models import Run
from tests.conftest import wait_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "run-heartbeat"]


def _leased_run(workspace):
    run = Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    lease = lease_acquire(run_id=run.pk, step_no=0, owner="w")
    assert lease is not None
    return run, lease


def test_short_steps_share_one_thread_and_renew_nothing(workspace, monkeypatch):
    renewals = []
    monkeypatch.setattr(heartbeats, "leases_renew", lambda leases: renewals.extend(leases) or {})
    _, lease = _leased_run(workspace)
    for _ in range(50):
        with Heartbeat(lease) as heartbeat:
            assert not heartbeat.should_stop()
    assert len(_heartbeat_threads()) == 1
    assert renewals == []


def test_a_long_step_is_renewed_and_its_end_stops_the_renewals(workspace):
    run, lease = _leased_run(workspace)
    with Heartbeat(lease) as heartbeat:
        started = timezone.now()
        wait_for(
            lambda: Run.objects.get(pk=run.pk).heartbeat_at > started,
            timeout=settings.RUN_LEASE_SECONDS * 2,
            message="a renewal",
        )
        assert not heartbeat.lost
    ended = Run.objects.get(pk=run.pk).heartbeat_at
    time.sleep(settings.RUN_LEASE_SECONDS / 3 + 0.5)
    assert Run.objects.get(pk=run.pk).heartbeat_at == ended
    assert heartbeat.done


def test_a_lease_taken_over_is_seen_by_its_heartbeat(workspace):
    run, lease = _leased_run(workspace)
    with Heartbeat(lease) as heartbeat:
        Run.objects.filter(pk=run.pk).update(lease_owner="successor", attempt=lease.attempt + 1)
        wait_for(lambda: heartbeat.lost, timeout=settings.RUN_LEASE_SECONDS * 2, message="loss")
        assert heartbeat.should_stop()
