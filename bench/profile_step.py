"""Where a step's time goes: queries per step and a profile of the step protocol.

Drives runs through the no-op handlers of ``bench.app`` in this process (no broker hop),
counting SQL statements per step and profiling with cProfile (or pyinstrument if
installed). Uses the benchmark database of ``make bench`` (created if missing).

    .venv/bin/python -m bench.profile_step --runs 20
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections import Counter

from bench.environment import bench_environment, database_recreate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--sort", default="cumulative", help="pstats order: cumulative, tottime")
    parser.add_argument(
        "--slice",
        type=float,
        default=None,
        help="seconds a step may go on with the next ones (default: RUN_STEP_SLICE_SECONDS)",
    )
    args = parser.parse_args()
    env = bench_environment()
    os.environ.update(env)
    database_recreate(env)
    import django

    django.setup()
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    for name in ("agentplatform", "celery", "django"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    call_command("migrate", verbosity=0)
    from bench.app import noop_handlers
    from runs import dispatch, engine
    from runs.models import Repository, Run, Workspace
    from runs.services import task_submit

    slice_seconds = settings.RUN_STEP_SLICE_SECONDS if args.slice is None else args.slice

    handlers = noop_handlers()
    engine.HANDLERS = handlers  # type: ignore[assignment]
    dispatch.run_wake = lambda **kwargs: None  # type: ignore[assignment]
    workspace = Workspace.objects.create(slug="p", name="p", max_active_runs=10**6)
    repository = Repository.objects.create(
        workspace=workspace, name="p", clone_url="/dev/null", max_active_runs=10**6
    )

    def drive(n: int) -> tuple[int, Counter[str], float, float]:
        kinds: Counter[str] = Counter()
        steps = 0
        submit_time = step_time = 0.0
        for _ in range(n):
            t = time.perf_counter()
            run = task_submit(workspace=workspace, repository=repository, instruction="p").run
            submit_time += time.perf_counter() - t
            while True:
                current = Run.objects.get(pk=run.pk)
                if current.status == "completed":
                    break
                with CaptureQueriesContext(connection) as queries:
                    t = time.perf_counter()
                    engine.step_execute(
                        run_id=str(run.pk),
                        step_no=current.step_no,
                        slice=engine.StepSlice(seconds=slice_seconds),
                    )
                    step_time += time.perf_counter() - t
                steps += Run.objects.get(pk=run.pk).step_no - current.step_no
                for q in queries.captured_queries:
                    kinds[q["sql"].split()[0]] += 1
        return steps, kinds, submit_time, step_time

    drive(2)  # warm
    steps, kinds, submit_time, step_time = drive(args.runs)
    print(f"{steps} steps; {sum(kinds.values()) / steps:.1f} queries per step {dict(kinds)}")
    per_step, per_submit = step_time / steps * 1000, submit_time / args.runs * 1000
    print(f"step {per_step:.2f} ms; submission {per_submit:.2f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    drive(args.runs)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
