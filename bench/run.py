"""``make bench``: the platform against its baselines, measured side by side, one table.

Every figure is a ratio against a baseline measured in the same run on the same services
(PostgreSQL of DATABASE_URL, Redis of REDIS_URL / CELERY_BROKER_URL), because absolute
figures on a shared machine are noise; each is the median of ``--reps`` repetitions with
min and max. The benchmark uses its own database (``<DATABASE_URL name>_bench``, dropped
and re-created) and starts and stops its own worker and web processes.

    .venv/bin/python -m bench.run                 # everything, default sizes
    .venv/bin/python -m bench.run --only wake,relay --reps 5
    .venv/bin/python -m bench.run --tiny          # seconds: the smoke test's sizes
    .venv/bin/python -m bench.run --only compare --against HEAD~1   # figures 4, 5 of both
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable

from agentplatform import supervision
from bench import inflight
from bench.figures import (
    capacity,
    compare,
    e2e,
    fairness,
    idle,
    parts,
    relay,
    scale,
    steps,
    wake,
    web,
)
from bench.harness import Bench


def inflight_measure(bench: Bench) -> None:
    inflight.from_bench(bench.table, tiny=bench.tiny, extra=bench.args.inflight_args)


# Each figure by its ``--only`` name; the default run measures MEASUREMENTS, in order.
FIGURES: dict[str, Callable[[Bench], None]] = {
    "steps": steps.steps_measure,
    "wake": wake.wake_measure,
    "relay": relay.relay_measure,
    "web": web.web_measure,
    "scale": scale.scale_measure,
    "idle": idle.idle_measure,
    "e2e": e2e.e2e_measure,
    "capacity": capacity.capacity_measure,
    "fairness": fairness.fairness_measure,
    "inflight": inflight_measure,
    "parts": parts.parts_measure,
    "compare": compare.compare_measure,
}
MEASUREMENTS = [
    "steps",
    "wake",
    "relay",
    "web",
    "scale",
    "idle",
    "e2e",
    "capacity",
    "fairness",
    "inflight",
]


def bench_run(bench: Bench) -> str:
    """The table of every figure chosen (``--only``), each measured from an empty broker
    on a settled database."""
    chosen = bench.args.only.split(",") if bench.args.only else MEASUREMENTS
    try:
        bench.setup()
        for name in chosen:
            bench.quiesce()
            bench.database_settle()
            FIGURES[name](bench)
    except BaseException:
        # What was measured before the failure is still worth seeing.
        print(bench.table.render(), flush=True)
        raise
    finally:
        bench.teardown()
    return bench.table.render()


def main(argv: list[str] | None = None) -> str:
    supervision.die_with_make()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated: {','.join(MEASUREMENTS)}; also parts (where a submission's "
        "cost goes) and compare (figures 4 and 5 against --against), which the default run "
        "leaves out",
    )
    parser.add_argument(
        "--against",
        default="",
        help="the git revision --only compare measures this tree against (e.g. HEAD~1)",
    )
    parser.add_argument("--tiny", action="store_true", help="smoke sizes (seconds)")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--wake-samples", type=int, default=30)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--read-runs", type=int, default=100_000)
    parser.add_argument(
        "--scale-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000, 100_000, 1_000_000],
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--layout", default="asgi", choices=["asgi", "wsgi"])
    parser.add_argument("--inflight-args", default="", help="e.g. '--runs 50 --latency 2'")
    parser.add_argument(
        "--shared-redis",
        action="store_true",
        help="use REDIS_URL / CELERY_BROKER_URL instead of a redis-server of its own",
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    unknown = sorted(set(args.only.split(",")) - set(FIGURES)) if args.only else []
    if unknown:
        parser.error(f"--only: no figure named {', '.join(unknown)}")
    if "compare" in args.only.split(",") and not args.against:
        parser.error("--only compare needs --against REVISION")
    # SIGTERM ends the run like Ctrl-C: the processes it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    table = bench_run(Bench(args))
    print(table)
    return table


if __name__ == "__main__":
    main()
