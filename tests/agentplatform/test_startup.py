"""A web process keeps what it loaded at start-up out of the garbage collector's passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["agentplatform.asgi", "agentplatform.wsgi"])
def test_the_web_entry_points_freeze_what_they_loaded(module: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agentplatform.settings"}
    out = subprocess.run(
        [sys.executable, "-c", f"import gc, {module}; print(gc.get_freeze_count())"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # Django, the URLconf, DRF and Celery: far more than a bare interpreter's objects.
    assert int(out.stdout.split()[-1]) > 50_000, out.stderr
