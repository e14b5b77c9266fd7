"""Figure 8: the demo task end to end on the scripted model, stepped in-process."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.harness import Bench
from bench.table import Figure, say


def e2e_measure(bench: Bench) -> None:
    say("e2e: the demo task on the scripted model, driven step by step in-process")
    from runs import demo, dispatch
    from runs.engine import step_execute
    from runs.models import Repository, Run
    from runs.services import task_submit

    original = dispatch.run_wake
    dispatch.run_wake = lambda **kwargs: None
    per_status: dict[str, list[float]] = {}
    walls = []
    try:
        for rep in range(bench.reps):
            origin = demo.sample_repository_create(
                Path(tempfile.mkdtemp(prefix="bench-e2e-")) / "origin"
            )
            # The demo's repository and scripted agent (``make demo``), on the bench's
            # services.
            repository = Repository.objects.create(
                workspace=bench.workspace,
                name=f"e2e-{rep}-{os.getpid()}",
                clone_url=str(origin),
                test_command=demo.test_command(),
                allowed_commands=demo.allowed_commands(),
            )
            started = time.perf_counter()
            run = task_submit(
                workspace=bench.workspace,
                repository=repository,
                instruction="Fix add() in calc/core.py so that the test suite passes.",
                model_options={"provider": "scripted", "script": demo.fix_script()},
            ).run
            times: dict[str, float] = {}
            for _ in range(200):
                current = Run.objects.get(pk=run.pk)
                if current.status in (
                    "completed",
                    "failed",
                    "cancelled",
                    "timed_out",
                    "awaiting_approval",
                ):
                    break
                t = time.perf_counter()
                step_execute(run_id=str(current.pk), step_no=current.step_no)
                times[current.status] = times.get(current.status, 0) + time.perf_counter() - t
            walls.append(time.perf_counter() - started)
            for status, seconds in times.items():
                per_status.setdefault(status, []).append(seconds * 1000)
            bench.table.notes.append(f"e2e run {rep}: ended {current.status}")
    finally:
        dispatch.run_wake = original
    bench.table.add(Figure("8. end to end, demo task to PR (scripted model)", "s", walls))
    for status, values in per_status.items():
        bench.table.add(Figure(f"8.   step time in {status}", "ms", values))
