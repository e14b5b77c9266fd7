"""Figures 1, 9 and 10: step throughput against raw Celery, relay and consumer tasks per
run, and new database connections per step."""

from __future__ import annotations

import time

from bench.environment import wait_for
from bench.harness import Bench
from bench.table import Figure, say


def raw_chain_rep(bench: Bench, chains: int, length: int) -> float:
    """Chains of ``length`` no-op tasks, all submitted at once: chains finished per second."""
    from celery import chain

    from bench.rawapp import noop

    bench.redis.set("bench:raw:done", 0)
    started = time.time()
    with noop.app.producer_or_acquire() as producer:
        for _ in range(chains):
            chain(*[noop.si() for _ in range(length)]).apply_async(producer=producer)
    wait_for(
        lambda: int(bench.redis.get("bench:raw:done") or 0) >= chains * length,
        300,
        "raw chains",
    )
    return chains / (time.time() - started)


def steps_measure(bench: Bench) -> None:
    runs = 4 if bench.tiny else bench.args.runs
    say(f"steps: {runs} runs x 8 no-op steps on one worker -c 2, against raw Celery")
    worker = bench.worker(2)
    raw = bench.raw_worker(2)
    rates, raw_rates, extras = [], [], []
    run_rates, chain_rates, length = [], [], 8
    bench.steps_rep(2)  # warm both processes' connections and imports
    bench.raw_rep(20)
    for _ in range(bench.reps):
        rate, extra = bench.steps_rep(runs)
        rates.append(rate)
        extras.append(extra)
        raw_rates.append(bench.raw_rep(int(extra["steps"])))
        # A run is a chain of steps: the same number of runs as raw Celery chains of
        # as many no-op tasks as a run has steps.
        run_rates.append(rate * runs / extra["steps"])
        length = max(1, round(extra["steps"] / runs))
        chain_rates.append(raw_chain_rep(bench, runs, length))
    bench.table.add(
        Figure(
            "1. step throughput (1 worker, -c 2)",
            "steps/s",
            rates,
            raw_rates,
            "raw no-op tasks/s",
        )
    )
    bench.table.add(
        Figure(
            f"1. runs/s ({runs} runs of {length} steps)",
            "runs/s",
            run_rates,
            chain_rates,
            f"raw {length}-task no-op chains/s",
        )
    )
    key = lambda k: [e[k] for e in extras]  # noqa: E731
    bench.table.add(
        Figure(
            f"9. relay tasks per run ({runs}-run burst)",
            "",
            key("relay_per_run"),
            target="<= 3",
        )
    )
    bench.table.add(Figure("9. consumer tasks per run", "", key("consume_per_run")))
    bench.table.add(Figure("9. events-queue backlog at last commit", "msgs", key("backlog_at_end")))
    bench.table.add(
        Figure("9. backlog zero after last commit", "s", key("drain_seconds"), target="<= 2")
    )
    bench.table.add(
        Figure("10. new DB connections per step", "", key("connections_per_step"), target="~0")
    )
    bench.procs.stop(raw)
    for child in worker:
        bench.procs.stop(child)
