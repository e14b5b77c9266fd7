"""Figures 7 and 10: what an idle worker and beat cost in CPU and new connections."""

from __future__ import annotations

import time

from bench.environment import PY, cpu_seconds
from bench.harness import Bench
from bench.table import Figure, say


def idle_measure(bench: Bench) -> None:
    seconds = 5 if bench.tiny else bench.args.idle_seconds
    say(f"idle: worker + beat CPU over {seconds} s, against a 100 ms polling loop")
    cpu, poll_cpu, conns, db_cpu = [], [], [], []
    for _ in range(bench.reps):
        children = bench.worker(2, name="idle-worker", beat=True)
        # Start-up is not idle: every sweep has fired once (the longest common
        # interval is 15 s) and the pool processes have their connections.
        time.sleep(3 if bench.tiny else 16)
        pids = [c.pid for c in children]
        backends = bench.backend_pids()
        sessions, before = bench.sessions(), cpu_seconds(pids)
        db_before = cpu_seconds(backends)
        time.sleep(seconds)
        cpu.append((cpu_seconds(pids) - before) * 60 / seconds)
        # The sweeps' queries cost PostgreSQL CPU too (their backends, kept open).
        db_cpu.append((cpu_seconds(backends) - db_before) * 60 / seconds)
        conns.append((bench.sessions() - sessions) * 60 / seconds)
        for child in children:
            bench.procs.stop(child)
        poller = bench.procs.start(
            "poller",
            [
                PY,
                "-c",
                (
                    "import os,time,psycopg\n"
                    "c=psycopg.connect(os.environ['DATABASE_URL'],autocommit=True)\n"
                    "while True:\n c.execute('SELECT 1').fetchone(); time.sleep(0.1)\n"
                ),
            ],
        )
        time.sleep(1)
        before = cpu_seconds([poller.pid])
        time.sleep(seconds)
        poll_cpu.append((cpu_seconds([poller.pid]) - before) * 60 / seconds)
        bench.procs.stop(poller)
    bench.table.add(
        Figure(
            "7. idle CPU, worker (-c 2) + beat",
            "CPU-s/min",
            cpu,
            poll_cpu,
            "100 ms polling loop",
            "< 0.6 CPU-s/min (1% of a core)",
        )
    )
    bench.table.add(
        Figure(
            "7. idle PostgreSQL CPU (their backends)",
            "CPU-s/min",
            db_cpu,
        )
    )
    bench.table.add(
        Figure(
            "10. new DB connections per idle minute",
            "",
            conns,
            target="~0",
        )
    )
