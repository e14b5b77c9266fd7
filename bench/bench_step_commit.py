"""Cost of the step protocol's bookkeeping against a bare transaction, on PostgreSQL.

For each of N runs: take the fenced lease, commit queued -> preparing with its
status-change event (RunEvent + OutboxEvent), release the lease. The baseline is one
transaction with one UPDATE per run (the least any durable step can do). Prints both
rates and their ratio; both are measured in this run, so the ratio is what to compare.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench \
        .venv/bin/python bench/bench_step_commit.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from django.db.models import F  # noqa: E402

from runs import dispatch  # noqa: E402
from runs.engine import step_commit  # noqa: E402
from runs.lease import lease_acquire  # noqa: E402
from runs.models import Repository, Run, Task, Workspace  # noqa: E402
from runs.protocol import Outcome, StepContext  # noqa: E402

N = int(os.environ.get("BENCH_RUNS", "500"))


def main() -> None:
    call_command("migrate", verbosity=0)
    import logging

    logging.getLogger("agentplatform").setLevel(logging.WARNING)
    workspace, _ = Workspace.objects.get_or_create(slug="bench", defaults={"name": "bench"})
    repository, _ = Repository.objects.get_or_create(
        workspace=workspace, name="bench", defaults={"clone_url": "/dev/null"}
    )
    tasks = Task.objects.bulk_create(
        [Task(workspace=workspace, repository=repository, instruction="bench") for _ in range(N)]
    )
    runs = Run.objects.bulk_create(
        [
            Run(task=t, workspace_id=t.workspace_id, repository_id=t.repository_id, run_no=1)
            for t in tasks
        ]
    )
    runs = list(Run.objects.filter(pk__in=[r.pk for r in runs]).select_related("task"))
    # The wake-up message is not part of what is measured here.
    dispatch.run_wake = lambda **kwargs: None  # type: ignore[assignment]

    started = time.perf_counter()
    for run in runs:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(step_no=F("step_no") + 1)
    baseline = N / (time.perf_counter() - started)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(step_no=0)

    started = time.perf_counter()
    for run in runs:
        lease = lease_acquire(run_id=run.id, step_no=0, owner="bench")
        assert lease is not None
        step_commit(StepContext(run, lease), Outcome(to=Run.Status.PREPARING))
    steps = N / (time.perf_counter() - started)

    print(f"baseline (1 UPDATE per transaction): {baseline:8.0f} /s")
    print(f"step protocol (lease + fenced commit + event + outbox): {steps:8.0f} steps/s")
    print(f"ratio step/baseline: {steps / baseline:.2f}")
    Task.objects.filter(pk__in=[t.pk for t in tasks]).delete()


if __name__ == "__main__":
    main()
