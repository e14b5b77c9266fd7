"""Wake-ups the safety-net sweeps send for a backlog no worker is draining yet.

A backlog of work items and of stalled runs sits in the database while the workers are
busy (or down). The baseline re-sends one wake-up per waiting row on every tick, as the
stall sweep used to; the work sweep and the stall sweep re-send only what is overdue,
with an interval that doubles per unanswered wake-up. Ten ticks, 10 s apart (time is
moved by shifting the rows' timestamps, so the bench takes seconds). Messages are
counted in a Redis of the bench's own (a redis-server on a free port).

    DATABASE_TEST_NAME=test_h11 .venv/bin/python bench/bench_sweep_wakeups.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["WORK_REWAKE_SECONDS"] = "30"

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import F  # noqa: E402
from django.utils import timezone  # noqa: E402

from agentplatform import embedded  # noqa: E402

ITEMS = int(os.environ.get("BENCH_ITEMS", 500))
RUNS = int(os.environ.get("BENCH_RUNS", 200))
TICKS, TICK_SECONDS = 10, 10
STALL = timedelta(seconds=60)


def _redis() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [str(embedded.valkey_server()), "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        cwd=tempfile.mkdtemp(),
    )
    time.sleep(0.5)
    return server, f"redis://127.0.0.1:{port}/0"


def _fill() -> None:
    from jobs.models import WorkItem
    from runs.models import Run
    from tests.factories import TaskFactory, WorkspaceFactory

    long_ago = timezone.now() - timedelta(hours=1)
    WorkItem.objects.bulk_create(
        WorkItem(
            kind="event.consume",
            key=f"bench:{n}",
            args={"consumer": "bench", "event_id": "0" * 32},
            queue="events",
            due_at=long_ago,
        )
        for n in range(ITEMS)
    )
    WorkItem.objects.update(created_at=long_ago)
    workspace = WorkspaceFactory()
    for _ in range(RUNS):
        Run.objects.create(task=TaskFactory(workspace=workspace), run_no=1)
    Run.objects.update(heartbeat_at=long_ago)


def _time_passes(seconds: int) -> None:
    from jobs.models import WorkItem
    from runs.models import Run

    shift = timedelta(seconds=seconds)
    WorkItem.objects.update(due_at=F("due_at") - shift, created_at=F("created_at") - shift)
    WorkItem.objects.exclude(woken_at=None).update(woken_at=F("woken_at") - shift)
    Run.objects.update(heartbeat_at=F("heartbeat_at") - shift)
    Run.objects.exclude(woken_at=None).update(woken_at=F("woken_at") - shift)


def _baseline_tick() -> int:
    """One wake-up per waiting row, every tick."""
    from celery import current_app

    from jobs.models import WorkItem
    from runs import dispatch
    from runs.models import Run
    from runs.state import STEPPABLE

    sent = 0
    with current_app.producer_or_acquire() as producer:
        for pk in WorkItem.objects.filter(status="pending").values_list("pk", flat=True):
            current_app.send_task("jobs.work", args=(pk,), queue="events", producer=producer)
            sent += 1
    for run_id, step_no, status in Run.objects.filter(
        status__in=STEPPABLE, lease_until__isnull=True
    ).values_list("pk", "step_no", "status"):
        dispatch.run_wake(run_id=run_id, step_no=step_no, status=status)
        sent += 1
    return sent


def _sweeps_tick() -> int:
    from jobs.work import work_sweep
    from runs.services import run_recover_stalled

    return work_sweep(limit=ITEMS).woken + run_recover_stalled(stall_after=STALL, limit=RUNS)


def _measure(tick) -> tuple[int, float]:
    from jobs.models import WorkItem
    from runs.models import Run

    WorkItem.objects.all().delete()
    Run.objects.all().delete()
    _fill()
    sent, spent = 0, 0.0
    for _ in range(TICKS):
        started = time.perf_counter()
        sent += tick()
        spent += time.perf_counter() - started
        _time_passes(TICK_SECONDS)
    return sent, spent / TICKS


def main() -> None:
    from celery import current_app

    base = settings.DATABASES["default"]["TEST"].get("NAME") or "test"
    settings.DATABASES["default"]["TEST"]["NAME"] = f"{base}_sweepbench"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    server, url = _redis()
    current_app.conf.broker_write_url = url
    try:
        naive, naive_tick = _measure(_baseline_tick)
        ours, ours_tick = _measure(_sweeps_tick)
    finally:
        server.kill()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    rows = ITEMS + RUNS
    print(f"backlog: {ITEMS} work items + {RUNS} stalled runs, {TICKS} ticks {TICK_SECONDS}s apart")
    for label, count, tick in (
        ("re-send every waiting row (baseline)", naive, naive_tick),
        ("work sweep + stall sweep", ours, ours_tick),
    ):
        print(f"{label:38s} {count:6d} messages, {tick * 1000:7.1f} ms/tick")
    print(f"messages per waiting row: baseline {naive / rows:.1f}, sweeps {ours / rows:.1f}")
    print(f"ratio baseline/sweeps: {naive / max(ours, 1):.1f}x fewer messages")


if __name__ == "__main__":
    main()
