"""Per-command overhead of the sandbox backends against a plain subprocess.

Each command is run N times three ways: ``subprocess.run`` directly (the baseline: what
the agent's commands cost with no walls), through ``LocalSandbox`` on the ``process``
backend (the supervision loop, rlimits, the working-copy size watch), and through
``LocalSandbox`` on ``bubblewrap`` (namespaces, mounts, prlimit, a cgroup per command,
and for a root worker the outer bwrap and setpriv that drop to an unprivileged uid). Two
commands: ``true`` (pure start-up cost) and ``python3 -c pass``
(a typical interpreter start). Prints milliseconds per command and the ratio to the
baseline, all measured in this run.

    .venv/bin/python bench/bench_sandbox.py            # BENCH_COMMANDS=200 by default
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
os.environ.setdefault("AGENTPLATFORM_VAR_DIR", tempfile.mkdtemp(prefix="bench-sandbox-"))

import django

django.setup()

from django.conf import settings  # noqa: E402

from runs.agent.backends import backend_get  # noqa: E402
from runs.agent.sandbox import LocalSandbox  # noqa: E402

N = int(os.environ.get("BENCH_COMMANDS", "200"))
COMMANDS = {"true": ["/usr/bin/true"], "python3 -c pass": ["/usr/bin/python3", "-c", "pass"]}


def _timed(call: object, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    settings.SANDBOX_ROOT = Path(tempfile.mkdtemp(prefix="bench-sandboxes-"))
    boxes = {}
    for name in ("process", "bubblewrap"):
        box = LocalSandbox(f"bench-{name}", backend=backend_get(name))
        box.create()
        boxes[name] = box
    print(f"sandbox per-command overhead, {N} commands each (ms per command: median, p95)")
    print(f"{'command':<18} {'way':<22} {'median':>8} {'p95':>8} {'x baseline':>11}")
    for label, argv in COMMANDS.items():

        def plain(argv: list[str] = argv, workdir: Path = boxes["process"].path) -> None:
            subprocess.run(argv, cwd=workdir, check=True, stdout=subprocess.DEVNULL)

        ways = {"subprocess (baseline)": plain}
        for name, box in boxes.items():

            def sandboxed(box: LocalSandbox = box, argv: list[str] = argv) -> None:
                result = box.run(argv, timeout=30)
                assert result.exit_code == 0, result.output

            ways[f"sandbox: {name}"] = sandboxed
        baseline = None
        for way, call in ways.items():
            _timed(call, 5)  # warm caches
            samples = _timed(call, N)
            median = statistics.median(samples)
            p95 = statistics.quantiles(samples, n=20)[-1]
            baseline = baseline or median
            print(f"{label:<18} {way:<22} {median:8.2f} {p95:8.2f} {median / baseline:10.1f}x")
    for box in boxes.values():
        box.remove()


if __name__ == "__main__":
    main()
