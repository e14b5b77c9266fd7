"""CPU slots: how many sandboxed commands run at once on this host, whatever the workers.

A run spends most of its life waiting on its model, so the ``agent`` queue is served by a
threads pool with hundreds of threads (docs/capacity.md); what those runs make the host
compute — the repository's commands and tests — must stay bounded by the cores instead.
Every sandboxed command takes a slot first and gives it back when its whole process tree
is gone.

A slot is an exclusive ``flock`` on one of ``SANDBOX_CPU_SLOTS`` files in
``SANDBOX_CPU_SLOTS_DIR``. Every worker process and thread of the host that points at the
same directory shares the limit (each acquisition opens its own file description, so two
threads of one process exclude each other too), and the kernel drops the lock of a
process that dies: no lease to expire, no slot lost to a killed worker. One directory per
host: a shared network file system would make it one limit for many hosts.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

# How long a command waiting for a slot sleeps between looks: a test suite takes seconds,
# so a few looks a second add nothing noticeable and cost nothing while idle.
POLL_SECONDS = 0.05
POLL_MAX_SECONDS = 0.25


class SlotWaitCancelled(Exception):
    """``should_stop`` turned true while the command waited for a slot."""


def slot_count() -> int:
    configured = int(settings.SANDBOX_CPU_SLOTS)
    return configured if configured > 0 else (os.cpu_count() or 1)


def slots_dir() -> Path:
    return Path(settings.SANDBOX_CPU_SLOTS_DIR)


def _try_take(directory: Path, count: int, start: int) -> int | None:
    """An open, locked slot file descriptor, or None when every slot is taken."""
    for offset in range(count):
        path = directory / f"slot-{(start + offset) % count}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd
    return None


@contextmanager
def cpu_slot(should_stop: Callable[[], bool] | None = None) -> Iterator[None]:
    """Hold one of the host's CPU slots for the duration of the block.

    Waits while every slot is taken, looking at ``should_stop`` (cancellation, a lost
    lease) between looks; raises SlotWaitCancelled when it turns true.
    """
    directory = slots_dir()
    directory.mkdir(parents=True, exist_ok=True)
    count = slot_count()
    # Start at a different slot per caller so that waiters do not all contend for slot 0.
    start = (os.getpid() + time.monotonic_ns()) % count
    delay = POLL_SECONDS
    while (fd := _try_take(directory, count, start)) is None:
        if should_stop is not None and should_stop():
            raise SlotWaitCancelled("stopped while waiting for a CPU slot")
        time.sleep(delay)
        delay = min(delay * 1.5, POLL_MAX_SECONDS)
    try:
        yield
    finally:
        os.close(fd)  # closing the description releases the lock
