"""``python -m tests.chaos [--light] [--scenario NAME ...]``: run the fault scenarios
against a platform started for the purpose and print the table.

Exit status 0 when no invariant was violated, 1 otherwise. ``--json PATH`` writes the
results for tools; ``--keep`` leaves the logs and data directory behind.

The run has a time budget (``--budget``, 15 minutes, 5 with ``--light``): a scenario
gets what is left of it, at most half of it, and one that runs over is stopped with a
``FAIL`` line naming it. Stopped by its budget, by SIGTERM, SIGINT or SIGHUP, the runner
tears its stack down before it exits; killed outright, its children stop on their
parent-death signal and its watchdog stops the rest (agentplatform.supervision).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

from agentplatform import supervision
from tests.chaos.profiles import FULL, LIGHT, Result
from tests.chaos.scenarios import LIGHT_SCENARIOS, SCENARIOS, SHARES_WINDOW, Harness
from tests.chaos.stack import FOREIGN, Stack

# Kept back from the budget for the teardown and the table: 30 s, a tenth of short ones.
TEARDOWN_SECONDS = 30
BUDGET_SECONDS = {"full": 15 * 60, "light": 5 * 60}


class Overrun(Exception):
    """A scenario ran past its share of the budget."""


class Stopped(Exception):
    """The runner was asked to stop (SIGTERM, SIGINT, SIGHUP)."""


def _stop_requested(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


@contextmanager
def budget(name: str, seconds: float) -> Iterator[None]:
    """Raise ``Overrun`` in the main thread when the block runs past ``seconds``."""

    def overrun(signum: int, frame: object) -> None:
        raise Overrun(f"{name} ran over its budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, overrun)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    parser.add_argument("--budget", type=float, help="seconds for the whole run")
    args = parser.parse_args(argv)
    profile = LIGHT if args.light else FULL
    if args.burst:
        profile = replace(profile, burst=max(args.burst, profile.burst_run))
    names = args.scenario or (LIGHT_SCENARIOS if args.light else list(SCENARIOS))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop_requested)
    supervision.die_with_make()
    stack = Stack(keep=args.keep)
    results: list[Result] = []
    started = time.monotonic()
    total = args.budget or BUDGET_SECONDS[profile.name]
    deadline = started + total - min(TEARDOWN_SECONDS, total / 10)
    failure = ""
    try:
        with budget("the platform's start", deadline - time.monotonic()):
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
        run_scenarios(harness, names, results, deadline=deadline, share=total / 2)
    except (Overrun, Stopped) as exc:
        failure = f"FAIL {exc}" if isinstance(exc, Overrun) else f"stopped by {exc}"
        print(failure, flush=True)
    finally:
        # Keep the logs of a failing run for whoever reads the violations.
        stack.keep = stack.keep or bool(failure) or not all(r.ok for r in results)
        # The teardown runs to its end: a second Ctrl-C must not leave half a stack.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
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
    if failure:
        print(failure)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in results], handle, indent=2)
    return 0 if all(r.ok for r in results) and not failure else 1


def run_scenarios(
    harness: Harness, names: list[str], results: list[Result], *, deadline: float, share: float
) -> None:
    """Each scenario (with the verdicts of those before it that waited for it) within
    what is left of the budget, at most ``share`` seconds."""
    waiting: list[Result] = []
    for name in names:
        with budget(f"scenario {name}", min(share, deadline - time.monotonic())):
            if name not in SHARES_WINDOW:
                harness.settle()
                report(waiting)
            result = SCENARIOS[name](harness)
        results.append(result)
        waiting.append(result)
        if not harness.open_windows:
            report(waiting)
    with budget(f"the verdict of scenario {names[-1]}", deadline - time.monotonic()):
        harness.settle()
    report(waiting)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Threads of a stopped scenario may still be sending to the stopped stack; they
    # must not hold the exit.
    os._exit(code)
