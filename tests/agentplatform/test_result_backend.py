"""The Celery result backend: loaded once per process, at a web process's start.

Loading it scans the entry points of every installed distribution; per thread, every
request thread of the web server paid that on its first wake-up, under load several
times the 20 ms it takes on an idle machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from agentplatform.celery import app

ROOT = Path(__file__).resolve().parents[2]


def test_threads_share_the_backend_loaded_before_them() -> None:
    loaded = app.backend
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 4
    assert all(backend is loaded for backend in seen)


_LOADS = """
import threading

import celery.app.base as base

loads = []
load = base.Celery._get_backend
base.Celery._get_backend = lambda self: loads.append(1) or load(self)

import agentplatform.{entry}
from agentplatform.celery import app

at_start = len(loads)
threads = [threading.Thread(target=lambda: app.backend) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(at_start, len(loads))
"""


def _loads(entry: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", _LOADS.format(entry=entry)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [int(n) for n in out.stdout.split()]


def test_web_entry_points_load_the_backend_at_start_once() -> None:
    # Loaded by the module itself, before any request; request threads load nothing.
    assert _loads("asgi") == [1, 1]
    assert _loads("wsgi") == [1, 1]
