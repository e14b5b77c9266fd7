"""The light chaos run: real processes, real faults, every invariant checked from the
database (tests/chaos; ``make chaos`` runs the full version).

It starts its own PostgreSQL cluster and Redis on free ports, so killing and restarting
them touches nothing shared; from the embedded default's PostgreSQL and Valkey binaries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.services import PG_BIN, REDIS_SERVER

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.no_services, pytest.mark.slow, pytest.mark.timeout(900)]


def _missing() -> list[str]:
    missing = [] if (PG_BIN / "initdb").exists() else [str(PG_BIN / "initdb")]
    return missing + ([] if shutil.which(REDIS_SERVER) else [REDIS_SERVER])


def test_light_chaos_run_keeps_every_invariant(tmp_path):
    missing = _missing()
    if missing:
        if os.environ.get("REQUIRE_SERVICES") == "1":
            pytest.fail(f"chaos needs {', '.join(missing)}")
        pytest.skip(f"chaos needs {', '.join(missing)}")
    report = tmp_path / "chaos.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--light", "--seed", "7", "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert report.exists(), completed.stdout[-4000:] + completed.stderr[-4000:]
    results = json.loads(report.read_text())

    assert [r["scenario"] for r in results] == [
        "worker SIGKILL",
        "PostgreSQL restart",
        "webhook x3 concurrent",
        "security inputs",
    ]
    assert all(r["faults"] > 0 for r in results), results
    violations = [f"{r['scenario']}: {v}" for r in results for v in r["violations"]]
    assert violations == [], completed.stdout[-4000:]
    assert completed.returncode == 0, completed.stdout[-4000:]
