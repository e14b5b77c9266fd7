"""How fast the operations dashboard and the run list are with 100k runs.

Seeds a dedicated PostgreSQL database (created if missing, reused when already seeded)
with N runs spread over a week via bulk_create, then times:
  - baseline: SELECT count(*) FROM runs_run (what the console's paginator avoids)
  - dashboard_metrics() and the dashboard page through Django's test client
  - the run changelist (first page, and a filtered page)
and prints each as milliseconds and as a ratio to the baseline and to the 1 s budget,
followed by the plan of each dashboard query (Index/Bitmap scan or Seq Scan).

    .venv/bin/python bench/bench_dashboard.py [--runs 100000] [--repeat 5]

Environment: BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/
agentplatform_bench_dashboard), REDIS_URL for the queue depths.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentplatform_bench_dashboard"


def database_ensure(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
    os.environ.setdefault("SECRET_KEY", "bench-secret-key-that-is-long-enough-0123456789abcdef")
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentplatform.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(total: int) -> None:
    from django.db import connection, transaction
    from django.utils import timezone

    from runs.models import Run, Task

    have = Run.objects.count()
    if have >= total:
        print(f"seed: {have} runs already present")
        return
    started = time.perf_counter()
    rng = random.Random(42)
    now = timezone.now()
    repositories = _seed_repositories()
    outcomes = ["completed"] * 80 + ["failed"] * 12 + ["cancelled"] * 5 + ["timed_out"] * 3
    active = ["queued", "running", "verifying", "awaiting_approval", "planning"]
    reasons = [
        "budget_cost",
        "step_error",
        "approval_rejected",
        "empty_patch",
        "recoveries_exhausted",
    ]
    batch = 5000
    remaining = total - have
    while remaining > 0:
        size = min(batch, remaining)
        tasks, runs = [], []
        for _ in range(size):
            repo = rng.choice(repositories)
            task = Task(
                workspace_id=repo.workspace_id,
                repository=repo,
                instruction=f"bench change {rng.randrange(10**9)}",
                status="completed",
            )
            tasks.append(task)
            begin = now - timedelta(seconds=rng.uniform(0, 7 * 86400))
            if rng.random() < 0.003:
                status, finished = rng.choice(active), None
                lease = begin + timedelta(seconds=30) if status != "awaiting_approval" else None
            else:
                status, lease = rng.choice(outcomes), None
                finished = begin + timedelta(seconds=rng.lognormvariate(5.3, 0.8))
            runs.append(
                Run(
                    task=task,
                    workspace_id=task.workspace_id,
                    repository_id=task.repository_id,
                    run_no=1,
                    status=status,
                    started_at=begin,
                    finished_at=finished,
                    heartbeat_at=begin,
                    lease_until=lease,
                    lease_owner="bench" if lease else "",
                    cost_usd=Decimal(str(round(rng.uniform(0.001, 0.5), 6))),
                    tokens_in=rng.randrange(1000, 90000),
                    tokens_out=rng.randrange(100, 9000),
                    failure_reason=rng.choice(reasons) if status in ("failed", "timed_out") else "",
                )
            )
        with transaction.atomic():
            Task.objects.bulk_create(tasks)
            Run.objects.bulk_create(runs)
        remaining -= size
    # auto_now_add stamped the insert time; move created/changed times to the story above.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_run SET created_at = started_at - interval '3 seconds', "
            "status_changed_at = COALESCE(finished_at, started_at)"
        )
        cursor.execute("VACUUM (ANALYZE)")  # as autovacuum would, were it on
    print(f"seed: {total - have} runs in {time.perf_counter() - started:.1f}s")


def _seed_repositories() -> list[Any]:
    """Sixty repositories in twenty workspaces, a third of them with a daily budget."""
    from runs.models import Repository, Workspace

    workspaces = [
        Workspace.objects.get_or_create(
            slug=f"bench{i}",
            defaults={
                "name": f"Bench {i}",
                "daily_cost_budget_usd": Decimal("50") if i % 3 == 0 else 0,
            },
        )[0]
        for i in range(20)
    ]
    repositories = [
        Repository.objects.get_or_create(
            workspace=workspaces[i % 20], name=f"repo{i}", defaults={"clone_url": "/nonexistent"}
        )[0]
        for i in range(60)
    ]
    return repositories


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """Median wall time in ms over ``repeat`` calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeat):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1000)
    return statistics.median(samples)


def plans() -> None:
    """EXPLAIN the dashboard's queries: they must not scan the whole runs table."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agentplatform.dashboard import dashboard_metrics

    with CaptureQueriesContext(connection) as captured:
        dashboard_metrics()
    print(f"\ndashboard queries: {len(captured.captured_queries)}")
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT") or "pg_class" in sql:
                continue
            cursor.execute("EXPLAIN " + sql)
            plan = " ".join(row[0] for row in cursor.fetchall())
            scans = sorted(
                {
                    part.split(" on ")[0].strip().split("  ")[-1]
                    for part in plan.split("->")
                    if " on " in part
                }
            )
            seq_runs = "Seq Scan on runs_run" in plan
            print(
                f"  {'SEQ-SCAN runs_run' if seq_runs else 'ok':17} "
                f"{', '.join(scans)[:70]:70} | {sql[:90]}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    database_ensure(url)
    setup(url)
    seed(args.runs)

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from agentplatform.dashboard import dashboard_metrics

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)

    def count_all() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM runs_run")
            cursor.fetchone()

    def page(url: str):  # type: ignore[no-untyped-def]
        def get() -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        return get

    baseline = timed(count_all, args.repeat)
    results = {
        "dashboard_metrics()": timed(dashboard_metrics, args.repeat),
        "GET /admin/dashboard/": timed(page("/admin/dashboard/"), args.repeat),
        "GET run list": timed(page("/admin/runs/run/"), args.repeat),
        "GET run list ?status=failed": timed(
            page("/admin/runs/run/?status__exact=failed"), args.repeat
        ),
        "GET run list ?liveness=stuck": timed(page("/admin/runs/run/?liveness=stuck"), args.repeat),
    }
    from runs.models import Run

    print(f"\nruns in database: {Run.objects.count()}  (median of {args.repeat})")
    print(f"{'baseline: SELECT count(*) FROM runs_run':40} {baseline:8.1f} ms")
    for name, ms in results.items():
        print(
            f"{name:40} {ms:8.1f} ms   x{ms / baseline:5.2f} of baseline   "
            f"{ms / 1000:5.1%} of the 1 s budget"
        )
    plans()


if __name__ == "__main__":
    main()
