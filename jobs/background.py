"""Wake-ups handed from request threads to one thread of the process's own.

A threaded web server's request threads note what is to be sent and go on; one thread
per process sends what was noted, and what is noted while it sends goes together in its
next send. A request thread then never waits on the broker: under load, a round trip to
another process on the same cores waits for that process to be scheduled, and a request
thread held there is one the server cannot use. ``WAKE_UPS_BATCHED`` (the web entry
point turns it on) chooses this for the wake-ups of new work items and of a commit's
Redis round.

What is noted lives in this process's memory until it is sent. Sent or not, the state
it wakes up for is committed: a wake-up that dies with the process, or is dropped over
the backlog's limit while the broker is unreachable, is one lost message, and the
sweeps wake what it was for.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from jobs.logs import log

Noted = TypeVar("Noted")


class SendingThread(Generic[Noted]):
    """What request threads ``note``, sent from one thread of this process.

    ``empty`` makes a new, empty collection of what is noted; ``send`` sends one
    collection. ``flush`` sends what is noted now, in the caller's thread, after any
    send under way: it runs at the process's exit, so what was noted before a graceful
    exit is sent."""

    def __init__(self, name: str, empty: Callable[[], Noted], send: Callable[[Noted], object]):
        self._name = name
        self._empty = empty
        self._send = send
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also in a forked child: the parent's thread is not there, a lock it held would
        # stay held, and what the parent noted is the parent's to send.
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        self._noted = self._empty()
        self._wake = threading.Event()
        self._pid = 0

    def note(self, add: Callable[[Noted], None]) -> None:
        """Add to what is noted (``add`` runs under the lock) and wake the thread."""
        with self._lock:
            add(self._noted)
            if self._pid != os.getpid():  # no thread yet, or it stayed in the parent
                self._pid = os.getpid()
                threading.Thread(target=self._loop, name=self._name, daemon=True).start()
                atexit.register(self.flush)
        self._wake.set()

    def sending(self) -> bool:
        """Whether a send is under way."""
        return self._sending.locked()

    def flush(self) -> None:
        with self._sending:
            with self._lock:
                noted, self._noted = self._noted, self._empty()
            if noted:
                self._send(noted)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # never ends the thread: the sweeps cover a lost wake-up
                log.warning("wake.send_failed", thread=self._name, exc_info=True)
