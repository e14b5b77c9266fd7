"""`make demo`'s command on the embedded default: SQLite, file broker, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.no_services, pytest.mark.slow]


def test_demo_completes_a_run_with_no_configuration(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "REDIS_URL",
            "SECRET_KEY",
            "DJANGO_SETTINGS_MODULE",
            "DATABASE_TEST_NAME",
        }
    }
    env.update(AGENTPLATFORM_VAR_DIR=str(tmp_path / "var"), COLUMNS="120")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    demo = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "run completed" in demo.stdout
    assert "agent.pr.created" in demo.stdout
    assert (tmp_path / "var" / "agentplatform.sqlite3").exists()
