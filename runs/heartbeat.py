"""The heartbeat of a step: renews its run's lease from a thread and sees cancellation
(docs/design.md §7)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time

from django.conf import settings
from django.db import connection

from runs.lease import Lease, leases_renew
from runs.logs import log


class Heartbeat:
    """Renews the lease every third of its length from a thread; sees cancellation.

    The lease is lost when the run's row says so (another worker took it) or when its
    ``lease_until`` passed without a successful renewal and no renewal is under way
    (a dead connection, a database restart, a starved thread): from then on the reaper
    may hand the run to another worker, so this one must stop before its next command
    or model call. A renewal that waits on the run's row lock is not a loss: whoever
    holds that lock also keeps the reaper out.

    The renewals are made by the process's heartbeat thread (``_Beats``), not a thread
    of the step's own: most steps end before their first renewal is due, and starting a
    thread per step cost its start (a scheduling delay under load) on every step.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.cancelled = False
        self._taken = False
        self._expired = False
        self._renewing = False
        self._interval = max(0.5, settings.RUN_LEASE_SECONDS / 3)
        # Monotonic deadline of the lease as last renewed (acquired just before).
        self._valid_until = time.monotonic() + settings.RUN_LEASE_SECONDS
        self.due = time.monotonic() + self._interval
        self.done = False
        # Held while a renewal is under way; the step's end waits for it.
        self._beat_lock = threading.Lock()
        # In the step's context: its log lines carry the run, task and trace ids.
        self._context = contextvars.copy_context()

    @property
    def lost(self) -> bool:
        # Sticky: a renewal that lands after the deadline does not undo the loss, since
        # the reaper may already have handed the run on.
        if not (self._expired or self._renewing) and time.monotonic() >= self._valid_until:
            self._expired = True
        return self._taken or self._expired

    @property
    def renew_from(self) -> float:
        """When (monotonic) this lease is renewed with the others: half an interval before
        it falls due, so the steps of a moment share one statement (``heartbeats_renew``)
        instead of one each."""
        return self.due - self._interval / 2

    def _renewal_begin(self) -> bool:
        """Under ``_beat_lock``: whether to renew now (the step is still on and the lease
        not lost); sets ``done`` when renewing must stop."""
        if self.done:
            return False
        self.due = time.monotonic() + self._interval
        if self.lost:
            self._context.run(log.warning, "heartbeat.lease_expired", run_id=str(self.lease.run_id))
            self.done = True
            return False
        self._renewing = True
        return True

    def _renewal_end(self, state: bool | None) -> None:
        """Under ``_beat_lock``: the renewal came back with ``state`` (``leases_renew``'s
        answer for this lease: None, no longer held)."""
        if state is None:
            self._taken = True
            self.done = True
            return
        self._valid_until = time.monotonic() + settings.RUN_LEASE_SECONDS
        self.cancelled = self.cancelled or state

    def should_stop(self) -> bool:
        return self.cancelled or self.lost

    def __enter__(self) -> Heartbeat:
        _beats.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _beats.remove(self)
        # A renewal under way finishes first; none starts after this.
        with self._beat_lock:
            self.done = True


def heartbeats_renew(heartbeats: list[Heartbeat]) -> None:
    """Renew the leases of ``heartbeats`` with one statement (``leases_renew``).

    A lease left out of the answer was taken by another worker: its step stops. A
    statement that fails (a dead connection, an exhausted pool) renews none of them:
    each lease stays good until its own deadline and becomes uncertain after it, as with
    a renewal of its own. Each heartbeat's lock is held until the answer is applied, so
    a step that ends meanwhile waits for it (and none starts after the step's end).
    """
    renewing: list[Heartbeat] = []
    try:
        for heartbeat in heartbeats:
            heartbeat._beat_lock.acquire()
            if heartbeat._renewal_begin():
                renewing.append(heartbeat)
            else:
                heartbeat._beat_lock.release()
        if not renewing:
            return
        try:
            states = leases_renew([heartbeat.lease for heartbeat in renewing])
        except Exception:
            for heartbeat in renewing:
                heartbeat._context.run(
                    log.warning,
                    "heartbeat.failed",
                    run_id=str(heartbeat.lease.run_id),
                    exc_info=True,
                )
            # The connection may be dead (a terminated backend, a restarted server):
            # close it so the next beat reconnects instead of failing on it until the
            # leases run out.
            with contextlib.suppress(Exception):
                connection.close()
            return
        for heartbeat in renewing:
            heartbeat._renewal_end(states.get(heartbeat.lease.run_id))
    finally:
        for heartbeat in renewing:
            heartbeat._renewing = False
            heartbeat._beat_lock.release()


class _Beats:
    """The process's heartbeat thread: renews the leases of the steps running in it.

    Started by the first step of the process and kept: it sleeps until the earliest
    renewal may be made (or a while when there is none), so a step shorter than a sixth
    of its lease never wakes it. The leases due at one moment are renewed by one statement
    (``heartbeats_renew``): a threads pool runs hundreds of steps in one process. Its
    database connection is closed whenever no step is left to renew, as a thread per
    step closed its own.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also in a forked child: the parent's thread and a lock it held are not there.
        self._lock = threading.Lock()
        self._beating: set[Heartbeat] = set()
        self._wake = threading.Event()
        self._wake_at = 0.0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beating.add(heartbeat)
            alive = self._thread is not None and self._thread.is_alive()
            if not alive or self._pid != os.getpid():
                # A new process (a fork of the pool) has no heartbeat thread yet.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="run-heartbeat", daemon=True)
                self._thread.start()
            elif heartbeat.renew_from < self._wake_at:
                self._wake.set()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beating.discard(heartbeat)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [h for h in self._beating if h.renew_from <= now]
                later = [h.renew_from for h in self._beating if h.renew_from > now]
                idle = now + max(0.25, settings.RUN_LEASE_SECONDS / 6)
                self._wake_at = min([*later, idle])
                self._wake.clear()
            try:
                heartbeats_renew(due)
            except Exception:  # never let one beat end the thread
                log.exception("heartbeat.crashed", runs=len(due))
            for heartbeat in due:
                if heartbeat.done:
                    self.remove(heartbeat)
            with self._lock:
                idle_now = not self._beating
            if idle_now and connection.connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            self._wake.wait(max(0.0, self._wake_at - time.monotonic()))


_beats = _Beats()
os.register_at_fork(after_in_child=_beats._reset)
