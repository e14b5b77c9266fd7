"""The benchmark harness runs (tiny sizes): its figures are not asserted, only produced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.services
@pytest.mark.slow
def test_bench_runs_with_tiny_sizes() -> None:
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--reps", "1", "--only", "steps,relay"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout
    for label in ("1. step throughput", "9. relay tasks per run", "3. relay publish"):
        assert label in table
    # Every figure that has a baseline got a ratio.
    assert "| -     | >= 0.5" not in table
