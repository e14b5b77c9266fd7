"""Each test process of a parallel run (pytest-xdist) has its own Redis database and
files, and what a test starts (workers, servers) inherits them without moving again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import json, os, tests.settings as s; print(json.dumps({k: os.environ[k] for k in "
    "('REDIS_URL', 'CELERY_BROKER_URL', 'AGENTPLATFORM_VAR_DIR')} | "
    "{'settings': [s.REDIS_URL, s.CELERY_BROKER_URL, str(s.VAR_DIR)]}))"
)


def _settings_of(env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.no_services
def test_each_test_process_has_its_own_redis_database_and_files(tmp_path: Path) -> None:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_XDIST_WORKER", "TEST_PROCESS_OWN", "DJANGO_SETTINGS_MODULE")
    }
    base |= {
        "REDIS_URL": "redis://127.0.0.1:6379/3",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/3",
        "AGENTPLATFORM_VAR_DIR": str(tmp_path),
    }
    seen = {}
    for worker in ("gw0", "gw1"):
        env = {**base, "PYTEST_XDIST_WORKER": worker}
        seen[worker] = _settings_of(env)
        # What the process's tests start inherits its environment, and stays on its own.
        child_env = {**env, **{k: v for k, v in seen[worker].items() if k != "settings"}}
        child_env["TEST_PROCESS_OWN"] = worker
        assert _settings_of(child_env) == seen[worker]
    assert seen["gw0"]["settings"] == [
        "redis://127.0.0.1:6379/4",
        "redis://127.0.0.1:6379/4",
        str(tmp_path / "gw0"),
    ]
    assert seen["gw1"]["settings"][:2] == ["redis://127.0.0.1:6379/5"] * 2
    # Without pytest-xdist nothing moves.
    assert _settings_of(base)["settings"] == [base["REDIS_URL"], base["REDIS_URL"], str(tmp_path)]
