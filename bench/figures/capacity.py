"""Figure 11: step throughput and each service's CPU with more worker processes."""

from __future__ import annotations

import time

from bench.environment import cpu_seconds
from bench.harness import Bench
from bench.table import Figure, say


def capacity_measure(bench: Bench) -> None:
    runs = 4 if bench.tiny else bench.args.runs
    concurrencies = [1, 2] if bench.tiny else [1, 2, 4]
    say(f"capacity: steps/s with {concurrencies} worker processes")
    rates: dict[int, list[float]] = {}
    share: dict[tuple[int, str], list[float]] = {}
    redis_pids = [
        c.pid
        for c in bench.procs.children
        if "redis-server" in str(c.args) or "valkey-server" in str(c.args)
    ]
    for c in concurrencies:
        children = bench.worker(c, name=f"cap-worker-{c}")
        bench.steps_rep(2)
        for _ in range(bench.reps):
            groups = {
                "worker": [child.pid for child in children],
                "postgres": bench.backend_pids(),
                "redis": redis_pids,
            }
            before = {k: cpu_seconds(v) for k, v in groups.items()}
            t = time.monotonic()
            rate, extra = bench.steps_rep(runs)
            elapsed = time.monotonic() - t
            rates.setdefault(c, []).append(rate)
            # Backends opened during the rep are missed; with persistent connections
            # there are next to none (figure 10).
            for k, v in groups.items():
                used = cpu_seconds(v) - before[k]
                share.setdefault((c, k), []).append(used / elapsed)
                share.setdefault((c, k + "_ms"), []).append(used / extra["steps"] * 1000)
        for child in children:
            bench.procs.stop(child)
    base = rates[concurrencies[0]]
    for c in concurrencies:
        bench.table.add(
            Figure(
                f"11. steps/s with {c} worker process(es)",
                "steps/s",
                rates[c],
                base,
                "1 process",
            )
        )
        for k in ("worker", "postgres", "redis"):
            if share[(c, k)] and max(share[(c, k)]) > 0:
                bench.table.add(
                    Figure(f"11.   {k} CPU with {c} process(es)", "cores", share[(c, k)])
                )
                bench.table.add(
                    Figure(f"11.   {k} CPU per step, {c} process(es)", "ms", share[(c, k + "_ms")])
                )
