"""Figure 12: a small workspace's task behind a large workspace's queue."""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Bench
from bench.table import Figure, say


def fairness_measure(bench: Bench) -> None:
    queued = 100 if bench.tiny else 1000
    say(f"fairness: workspace A with {queued} queued runs, then one of workspace B")
    from bench.bench_fairness import small_workspace_start

    slots, seconds = [], []
    for rep in range(bench.reps):
        workers: list[Any] = []
        slot, took = small_workspace_start(
            lambda started=workers: started.extend(bench.worker(1, name="fair-worker")),
            queued=queued,
            tag=f"{rep}-{time.time_ns()}",
        )
        slots.append(slot)
        seconds.append(took)
        bench.procs.stop_all(workers)
        bench.broker_purge()
    bench.table.add(
        Figure("12. small workspace's task starts at free slot", "slot", slots, target="1")
    )
    bench.table.add(Figure("12. small workspace's task started after", "s", seconds))
