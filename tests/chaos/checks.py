"""What scenarios read off the stack besides the invariants: the API's accept rate, the
beats' logs, what an outsider can see, and the API fuzzed."""

from __future__ import annotations

import re
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from tests.chaos.invariants import db
from tests.chaos.load import Load
from tests.chaos.profiles import Result
from tests.chaos.services import Child
from tests.chaos.stack import Stack


def accept_rate(submissions: list[Any], sent: float) -> str:
    """The API's accept rate over the burst: overall, per 10 s window, and the latency."""
    answered = sorted(s.answered - sent for s in submissions if s.accepted)
    if not answered:
        return "no submission accepted"
    windows: dict[int, int] = {}
    for at in answered:
        windows[int(at // 10)] = windows.get(int(at // 10), 0) + 1
    rates = sorted(n / 10 for n in windows.values())
    latencies = sorted(s.latency for s in submissions if s.accepted)
    return (
        f"API accepted {len(answered)} in {answered[-1]:.1f}s "
        f"({len(answered) / max(answered[-1], 0.001):.0f}/s); per 10 s window "
        f"min {rates[0]:.0f}/s, median {rates[len(rates) // 2]:.0f}/s, max {rates[-1]:.0f}/s; "
        f"latency p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.0f} ms"
    )


def beat_starts(child: Child) -> int:
    """How many times the beat has logged its start in its log so far."""
    if not child.log_path.exists():
        return 0
    return child.log_path.read_bytes().count(b"beat: Starting...")


SEND_LINE = re.compile(r"^(\S+Z) .*Scheduler: Sending due task (.+?) \(")


def beat_sends(logs: list[Path], *, since: float) -> dict[str, list[float]]:
    """When each schedule was sent, by any beat, from ``since`` (epoch seconds) on."""
    sends: dict[str, list[float]] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            match = SEND_LINE.match(line)
            if not match:
                continue
            at = datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
            if at >= since:
                sends.setdefault(match.group(2), []).append(at)
    return {name: sorted(times) for name, times in sends.items()}


def double_fires(sends: dict[str, list[float]]) -> list[str]:
    """A schedule sent twice within half its interval: two beats both ticking."""
    from django_celery_beat.models import PeriodicTask

    every = dict(db(lambda: list(PeriodicTask.objects.values_list("name", "interval__every"))))
    problems = []
    for name, times in sends.items():
        interval = every.get(name)
        if not interval:
            continue
        close = [b - a for a, b in pairwise(times) if b - a < interval / 2]
        if close:
            problems.append(
                f"schedule {name!r} (every {interval}s) sent {len(close) + 1} times "
                f"within {max(close):.1f}s"
            )
    return problems


def outsider_probes(load: Load) -> list[tuple[str, str]]:
    from runs.models import Run, Task

    def collect() -> list[tuple[str, str]]:
        task = Task.objects.filter(workspace_id=load.scope.workspace_id).first()
        run = Run.objects.filter(task=task).first()
        probes = [
            ("GET", f"/api/workspaces/{load.scope.slug}/"),
            ("GET", f"/api/repositories/{load.scope.repository_id}/"),
        ]
        if task is not None:
            probes.append(("GET", f"/api/tasks/{task.id}/"))
        if run is not None:
            probes += [
                ("GET", f"/api/runs/{run.id}/"),
                ("GET", f"/api/runs/{run.id}/events/"),
                ("GET", f"/api/runs/{run.id}/artifacts/"),
                ("POST", f"/api/runs/{run.id}/cancel/"),
                ("POST", f"/api/runs/{run.id}/approve/"),
                ("POST", f"/api/runs/{run.id}/reject/"),
                ("POST", f"/api/runs/{run.id}/retry/"),
            ]
        return probes

    return db(collect)


def outsider_leaks(outsider: Load, probes: list[tuple[str, str]]) -> list[str]:
    import httpx

    leaks = []
    with httpx.Client(base_url=outsider.stack.url, timeout=30) as client:
        for method, path in probes:
            response = client.request(
                method, path, headers={"Authorization": f"Bearer {outsider.scope.token}"}, json={}
            )
            if response.status_code != 404:
                leaks.append(f"outsider {method} {path} answered {response.status_code}")
    return leaks


def fuzz(stack: Stack, load: Load, examples: int, result: Result) -> str:
    """schemathesis against the live schema, with and without a token: no 5xx."""
    import subprocess
    import sys
    from pathlib import Path

    st = Path(sys.executable).with_name("st")
    # Both runs at once: each alternates between generating cases and waiting for the server.
    runs = {
        label: subprocess.Popen(
            [
                str(st),
                "run",
                f"{stack.url}/api/schema/",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                str(examples),
                "--exclude-path",
                "/api/runs/{id}/stream",
                "--suppress-health-check",
                "all",
                *headers,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label, headers in (
            ("token", ["-H", f"Authorization: Bearer {load.scope.token}"]),
            ("anonymous", []),
        )
    }
    summary = []
    for label, process in runs.items():
        try:
            stdout, stderr = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        tail = stdout.strip().splitlines()[-1:] or [stderr[-200:]]
        summary.append(f"{label}: exit {process.returncode} {tail[0][:120]}")
        if process.returncode != 0:
            (stack.log_dir / f"schemathesis-{label}.log").write_text(stdout)
            result.violations.append(
                f"schemathesis ({label}) found failures: "
                f"see {stack.log_dir}/schemathesis-{label}.log"
            )
    return "fuzz " + "; ".join(summary)
