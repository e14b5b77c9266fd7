"""Beat that any number of hosts can run: only the leader sends due tasks.

The leader holds a session-level PostgreSQL advisory lock on a connection of its own;
if the leader dies, its connection closes, the lock is released and another beat takes
over within ``LEADER_RETRY_SECONDS``. Schedules stay in django-celery-beat's tables, so
operators edit them in the admin.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from time import monotonic
from typing import Any

import psycopg
from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

from jobs.logs import log

LEADER_RETRY_SECONDS = 2.0
# How often the leader asks the database whether an operator changed the schedules.
SCHEDULE_CHECK_SECONDS = 5.0
# How long to wait for an entry that falls due within Celery's 10 ms drift allowance.
DUE_SOON_SECONDS = 0.01
LEADER_LOCK_NAME = "agentplatform:beat-leader"


class LeaderLock:
    """A process-wide leadership lock; ``held()`` re-checks it on every call."""

    def __init__(self) -> None:
        self._conn: Any = None

    def held(self) -> bool:
        if self._conn is not None:
            try:
                # Leadership lasts as long as this connection: prove it is alive.
                self._conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                log.warning("beat.leader_connection_lost")
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
        db = settings.DATABASES["default"]
        try:
            conn = psycopg.connect(
                dbname=db["NAME"],
                user=db.get("USER") or None,
                password=db.get("PASSWORD") or None,
                host=db.get("HOST") or None,
                port=db.get("PORT") or None,
                autocommit=True,
                application_name="agentplatform-beat-leader",
            )
        except psycopg.Error:
            log.warning("beat.leader_connect_failed", exc_info=True)
            return False
        key = zlib.crc32(LEADER_LOCK_NAME.encode())
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()
        if not (row and row[0]):
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None


class LeaderDatabaseScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler that ticks only while it is the leader."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._leader = LeaderLock()
        self._leading = False
        self._changes_checked_at = float("-inf")
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._leader.held():
            if self._leading:
                log.warning("beat.leadership_lost")
            self._leading = False
            return LEADER_RETRY_SECONDS
        if not self._leading:
            log.info("beat.leader_acquired", pid=os.getpid())
            self._leading = True
            # The previous leader advanced last_run_at meanwhile: read the schedule
            # again instead of firing from this process's stale copy.
            self._initial_read = True
            self._heap = None
        interval = float(super().tick(*args, **kwargs))
        # Celery takes a 10 ms drift allowance off the time left to an entry that is not
        # due yet, so an entry due in under 10 ms gives a negative interval, on which
        # beat ticks again without sleeping: a dozen ticks, each with its database
        # round trips, every time entries fell due. Wait for the entry instead; 0 (the
        # next due entry, at once) stays 0.
        return interval if interval >= 0 else DUE_SOON_SECONDS

    def schedule_changed(self) -> bool:
        """django-celery-beat's check for edited schedules, at most every few seconds.

        It asks on every tick (three queries: health check, commit, read), and a tick
        comes at every entry sent, a dozen a minute. An edit in the admin now takes
        effect within ``SCHEDULE_CHECK_SECONDS`` of its save.
        """
        now = monotonic()
        if now - self._changes_checked_at < SCHEDULE_CHECK_SECONDS:
            return False
        self._changes_checked_at = now
        return bool(super().schedule_changed())

    def reserve(self, entry: Any) -> Any:
        new_entry = super().reserve(entry)
        # django-celery-beat keeps the sent entry's previous copy (its old last_run_at) in
        # the schedule; a heap rebuilt from it before the next sync (the tables changed
        # twice within one tick: a second beat starting up) sent the entry again at once.
        self._schedule[new_entry.name] = new_entry
        return new_entry

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._leader.release()
