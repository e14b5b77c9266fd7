"""Figure 2: wake latency, from a submission's commit to its step's work starting."""

from __future__ import annotations

import time

from bench.environment import broker_queue_keys, wait_for
from bench.harness import Bench
from bench.table import Figure, pct, say


def wake_measure(bench: Bench) -> None:
    samples = 5 if bench.tiny else bench.args.wake_samples
    say(f"wake: {samples} single runs on an idle worker, against raw delay() -> start")
    from django.db import transaction

    from bench.rawapp import stamp
    from runs.services import task_submit

    worker = bench.worker(2)
    raw = bench.raw_worker(2)
    p50s, p99s, raw50, raw99 = [], [], [], []
    for _ in range(bench.reps):
        latencies = []
        for _ in range(samples + 1):
            committed: list[float] = []
            with transaction.atomic():
                transaction.on_commit(lambda: committed.append(time.time()))  # noqa: B023
                run = task_submit(
                    workspace=bench.workspace,
                    repository=bench.repository,
                    instruction="bench",
                ).run
            bench.wait_terminal([run.id], timeout=60)
            worker_idle_wait(bench)
            started = float(bench.redis.get(f"bench:started:{run.id}"))
            latencies.append(started - committed[0])
        latencies = latencies[1:]  # the first warms the worker process
        p50s.append(pct(latencies, 0.5) * 1000)
        p99s.append(pct(latencies, 0.99) * 1000)
        bench.redis.delete("bench:raw:latency")
        for _ in range(samples + 1):
            n = bench.redis.llen("bench:raw:latency")
            stamp.delay(time.time())
            wait_for(lambda: bench.redis.llen("bench:raw:latency") > n, 30, "raw stamp")  # noqa: B023
            time.sleep(0.05)
        raw_latencies = [float(x) for x in bench.redis.lrange("bench:raw:latency", 1, -1)]
        raw50.append(pct(raw_latencies, 0.5) * 1000)
        raw99.append(pct(raw_latencies, 0.99) * 1000)
    bench.table.add(
        Figure(
            "2. wake latency p50 (commit -> step work starts)",
            "ms",
            p50s,
            raw50,
            "raw delay() -> start",
        )
    )
    bench.table.add(
        Figure(
            "2. wake latency p99",
            "ms",
            p99s,
            raw99,
            "raw delay() -> start",
        )
    )
    bench.procs.stop(raw)
    for child in worker:
        bench.procs.stop(child)


def worker_idle_wait(bench: Bench) -> None:
    """Until the worker is idle again: no relay pass due and no message queued or
    being worked on; then as long as the raw baseline's pause between samples.

    A run's end leaves its events' last relay pass due a coalescing window later
    (``OUTBOX_RELAY_COALESCE_SECONDS``), and its consumers after that: a fixed pause
    shorter than the window started the next sample beside them.
    """
    from jobs.relay import RELAY_SCHEDULED_KEY

    queues = broker_queue_keys()

    def idle() -> bool:
        return (
            not bench.redis.exists(RELAY_SCHEDULED_KEY)
            and not bench.broker.hlen("unacked")
            and not any(bench.broker.llen(q) for q in queues)
        )

    wait_for(idle, 30, "an idle worker", every=0.01)
    time.sleep(0.05)
