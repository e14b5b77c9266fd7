"""Stopping child processes that run in sessions of their own, as whole groups.

``make serve``, ``make demo``, the benchmark and the tests start the web server, workers
and beat with ``start_new_session=True``, so each child leads a process group that
holds its own children too (a worker's pool, uvicorn's workers); stopping the group
stops all of them, and nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Any


def process_groups_stop(children: Iterable[subprocess.Popen[Any]], *, timeout: float) -> None:
    """Stop each child's process group: SIGTERM to all, then SIGKILL to the groups that
    have not exited ``timeout`` seconds later (one deadline for all, not one each)."""
    children = list(children)
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
