"""``python -m tests.chaos [--light] [--scenario NAME ...]``: run the fault scenarios
against a platform started for the purpose and print the table.

Exit status 0 when no invariant was violated, 1 otherwise. ``--json PATH`` writes the
results for tools; ``--keep`` leaves the logs and data directory behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, replace

from tests.chaos.scenarios import (
    FULL,
    LIGHT,
    LIGHT_SCENARIOS,
    SCENARIOS,
    SHARES_WINDOW,
    Harness,
    Result,
)
from tests.chaos.stack import FOREIGN, Stack

COLUMNS = ("scenario", "runs", "faults", "lost", "duplicated", "stuck", "max recovery", "time")


def table(results: list[Result]) -> str:
    rows = [
        (
            r.scenario,
            str(r.runs),
            str(r.faults),
            str(r.lost),
            str(r.duplicated),
            str(r.stuck),
            f"{r.recovery:.1f} s" if r.recovery else "-",
            f"{r.seconds:.0f} s",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def report(results: list[Result]) -> None:
    """One progress line per scenario whose verdict is complete."""
    for result in results:
        status = "ok" if result.ok else f"{len(result.violations)} VIOLATIONS"
        print(f"  {result.scenario}: {status} in {result.seconds:.0f}s", flush=True)
    results.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--light", action="store_true", help="the seconds-long subset")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--keep", action="store_true", help="keep logs and data")
    parser.add_argument("--burst", type=int, help="submissions in the burst scenario")
    args = parser.parse_args(argv)
    profile = LIGHT if args.light else FULL
    if args.burst:
        profile = replace(profile, burst=max(args.burst, profile.burst_run))
    names = args.scenario or (LIGHT_SCENARIOS if args.light else list(SCENARIOS))

    stack = Stack(keep=args.keep)
    results: list[Result] = []
    started = time.monotonic()
    try:
        stack.start()
        for key in FOREIGN:
            os.environ.pop(key, None)
        os.environ.update(stack.env)
        import django

        django.setup()
        # The load's own HTTP requests are not news.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        print(
            f"chaos ({profile.name}, seed {args.seed}): platform up in "
            f"{time.monotonic() - started:.0f}s, logs in {stack.log_dir}",
            flush=True,
        )
        harness = Harness(stack, profile, args.seed)
        waiting: list[Result] = []
        for name in names:
            if name not in SHARES_WINDOW:
                harness.settle()
                report(waiting)
            result = SCENARIOS[name](harness)
            results.append(result)
            waiting.append(result)
            if not harness.open_windows:
                report(waiting)
        harness.settle()
        report(waiting)
    finally:
        # Keep the logs of a failing run for whoever reads the violations.
        stack.keep = stack.keep or not all(r.ok for r in results)
        stack.stop()
    print()
    print(table(results))
    print()
    for result in results:
        for note in result.notes:
            print(f"{result.scenario}: {note}")
        for violation in result.violations[:20]:
            print(f"{result.scenario}: VIOLATION {violation}")
        if len(result.violations) > 20:
            print(f"{result.scenario}: … {len(result.violations) - 20} more violations")
    print(f"\ntotal {time.monotonic() - started:.0f}s, seed {args.seed}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in results], handle, indent=2)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
