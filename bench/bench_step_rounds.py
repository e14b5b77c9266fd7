"""A step's wall time with its commit's wake-ups handed to the sending thread, against
the same steps sending them inline, in one process taking turns (the machine's drift
falls on both alike).

Each run goes through the no-op handlers of ``bench.app`` in one slice
(``step_execute``), on ``make bench``'s database (re-created) and the Redis of
``REDIS_URL``. A commit whose round wakes no run hands it to the process's
``redis-round`` thread; the inline turns send every round in the step's own thread, as
workers did before. Prints the median milliseconds a step of each, and of the paired
differences.

    .venv/bin/python -m bench.bench_step_rounds --pairs 16 --runs 15
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import time
from collections.abc import Iterator

from bench.run import bench_environment, database_recreate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--runs", type=int, default=15, help="runs per turn")
    args = parser.parse_args()
    env = bench_environment()
    os.environ.update(env)
    database_recreate(env)
    import django

    django.setup()
    logging.disable(logging.INFO)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from bench.app import noop_handlers
    from jobs import redis_round
    from runs import engine
    from runs.models import Repository, Run, Workspace
    from runs.services import task_submit

    handlers = noop_handlers()
    engine._handlers = lambda: handlers  # type: ignore[assignment]
    workspace = Workspace.objects.create(slug="r", name="r", max_active_runs=10**6)
    repository = Repository.objects.create(
        workspace=workspace, name="r", clone_url="/dev/null", max_active_runs=10**6
    )
    handed_over = redis_round.together

    @contextlib.contextmanager
    def inline(*, background: bool = False) -> Iterator[None]:
        with handed_over():
            yield

    def turn(runs: int) -> float:
        """Milliseconds a step, over ``runs`` runs of one slice each."""
        seconds = steps = 0.0
        for _ in range(runs):
            run = task_submit(workspace=workspace, repository=repository, instruction="r").run
            started = time.perf_counter()
            engine.step_execute(run_id=str(run.pk), step_no=0, slice=engine.StepSlice(seconds=30))
            seconds += time.perf_counter() - started
            steps += Run.objects.get(pk=run.pk).step_no
        return seconds / steps * 1000

    turn(5)  # warm: connections, prepared statements, the sending thread
    times: dict[str, list[float]] = {"handed over": [], "inline": []}
    for pair in range(args.pairs):
        order = ("handed over", "inline") if pair % 2 else ("inline", "handed over")
        for mode in order:
            redis_round.together = handed_over if mode == "handed over" else inline  # type: ignore[assignment]
            times[mode].append(turn(args.runs))
    redis_round.together = handed_over  # type: ignore[assignment]
    for mode, values in times.items():
        print(f"{mode}: {statistics.median(values):.3f} ms a step (median of {len(values)} turns)")
    saved = [a - b for a, b in zip(times["inline"], times["handed over"], strict=True)]
    print(f"inline minus handed over, paired: median {statistics.median(saved):.3f} ms a step")


if __name__ == "__main__":
    main()
