"""Who an API token is, and which repositories its user may submit to, remembered per
process and forgotten the moment PostgreSQL says any of it changed.

Every API request looks its token up, and every submission its repository among the
caller's workspaces: round trips to PostgreSQL that give the same answer for the same
caller until a token, a user, a membership, a repository or a workspace changes. Such a
change fires a trigger (``runs`` migration 0019) that notifies ``CHANNEL`` when its
transaction commits, whatever made it (the API, the admin, a shell, plain SQL). A
listener thread in each process that uses this memory hears it and forgets everything:
the generation moves on. A revoked token, a deactivated user or a removed member is
refused from the moment the notification arrives, milliseconds after the commit.

The memory is used only while the listener is known to be hearing. Every
``CONFIRM_EVERY`` seconds it notifies itself on a channel of its own and is confirmed
when that notification comes back: PostgreSQL delivers notifications in commit order,
so every change committed before the probe has been heard by then. The memory is
ignored once ``STALE_AFTER`` seconds pass without a confirmation (a lost connection, a
stalled thread, a pooler that does not pass notifications on). When the listener
(re)connects it starts a new generation: notifications sent while it was away are lost.
An answer read from the database is remembered only if no notification arrived while
it was being read: it is stored under the generation taken before the read, and an
entry of an older generation is never returned. Inside a transaction the memory is not
used at all, since the transaction may have changed what the database would answer.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, connections, transaction

from runs.models import ApiToken, Membership, Repository, Workspace

log = structlog.get_logger("agentplatform.api")

CHANNEL = "agentplatform_access"
# The listener's own notification, sent to itself every ``CONFIRM_EVERY`` seconds.
PROBE_CHANNEL = "agentplatform_access_probe"
CONFIRM_EVERY = 1.0
STALE_AFTER = 3.0
# Bounds on what is remembered: entries expire after the setting's seconds even if no
# change is heard, and the memory starts over once it holds this many.
MAX_ENTRIES = 10_000

_lock = threading.Lock()
_entries: dict[Hashable, tuple[int, float, Any]] = {}
_generation = 0
_confirmed_at = -math.inf
# When the last probe that came back was sent: every change committed before it was heard.
_heard_until = -math.inf
_listener_pid: int | None = None
_listener: threading.Thread | None = None
_stopping = threading.Event()


def generation() -> int | None:
    """The generation to read and remember under, or None when the memory may not be
    used now (off, inside a transaction, the listener not confirmed)."""
    if not settings.API_ACCESS_CACHE_SECONDS:
        return None
    if connection.in_atomic_block:
        return None
    if _listener_pid != os.getpid():
        _listener_start()
    if time.monotonic() - _confirmed_at > STALE_AFTER:
        return None
    return _generation


def recall(key: Hashable, current: int) -> Any | None:
    """What was remembered under ``key`` in the ``current`` generation and not expired."""
    entry = _entries.get(key)
    if entry is None or entry[0] != current or entry[1] < time.monotonic():
        return None
    return entry[2]


def remember(key: Hashable, value: Any, read_in: int) -> None:
    """Remember ``value``, read from the database in generation ``read_in``: kept only if
    no change was heard since (the generation is still the same)."""
    expires = time.monotonic() + settings.API_ACCESS_CACHE_SECONDS
    with _lock:
        if read_in != _generation:
            return
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key] = (read_in, expires, value)


def read_through(key: Hashable, read: Callable[[], Any | None]) -> Any | None:
    """What is remembered under ``key``, or what ``read`` (a database lookup) answers,
    then remembered if it found something and the memory may be used."""
    read_in = generation()
    value = recall(key, read_in) if read_in is not None else None
    if value is None:
        value = read()
        if value is not None and read_in is not None:
            remember(key, value, read_in)
    return value


def replace(key: Hashable, value: Any) -> None:
    """Put ``value`` in place of what is remembered under ``key`` in the current
    generation (nothing if there is none): the same row with bookkeeping this process
    just wrote, which notifies nobody."""
    with _lock:
        entry = _entries.get(key)
        if entry is not None and entry[0] == _generation:
            _entries[key] = (entry[0], entry[1], value)


def forget_all() -> None:
    """Start a new generation: nothing remembered so far is returned again."""
    global _generation
    with _lock:
        _generation += 1
        _entries.clear()


def forget_all_on_commit(**kwargs: Any) -> None:
    """Start a new generation once the current transaction commits (at once outside
    one): this process's own changes are not answered from memory even before their
    notification arrives. A signal receiver, hence ``kwargs``."""
    transaction.on_commit(forget_all, robust=True)


def _signals_connect() -> None:
    from django.contrib.auth import get_user_model
    from django.db.models import signals

    for model in (ApiToken, get_user_model(), Membership, Repository, Workspace):
        for signal in (signals.post_save, signals.post_delete):
            signal.connect(
                forget_all_on_commit, sender=model, dispatch_uid=f"access-cache-{model._meta.label}"
            )


_signals_connect()


def heard_since(moment: float) -> bool:
    """Whether every change committed before ``moment`` (``time.monotonic()``) has been
    heard: a probe sent after it came back."""
    return _heard_until > moment


def _confirm(sent_at: float) -> None:
    global _confirmed_at, _heard_until
    _confirmed_at = time.monotonic()
    _heard_until = sent_at


def _unconfirm() -> None:
    global _confirmed_at, _heard_until
    _confirmed_at = _heard_until = -math.inf


def _listener_start() -> None:
    """Start this process's listener (once per process: a forked child starts its own)."""
    global _listener_pid, _listener
    with _lock:
        if _listener_pid == os.getpid():
            return
        _listener_pid = os.getpid()
        _entries.clear()
    _unconfirm()
    _stopping.clear()
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    _listener = threading.Thread(
        target=_listen, args=(params,), name="access-cache-listener", daemon=True
    )
    _listener.start()


def listener_stop(timeout: float = 10.0) -> None:
    """Stop this process's listener and close its connection (before the database it
    listens to is dropped); the next ``generation()`` starts another."""
    global _listener_pid
    _stopping.set()
    _unconfirm()
    if _listener is not None:
        _listener.join(timeout)
    _listener_pid = None


def _listen(params: dict[str, Any]) -> None:
    import psycopg

    pause = 0.5
    name = "agentplatform-access-listener"
    while not _stopping.is_set():
        try:
            with (
                psycopg.connect(**params, autocommit=True, application_name=name) as conn,
                psycopg.connect(**params, autocommit=True, application_name=name) as sender,
            ):
                conn.execute(f"LISTEN {CHANNEL}")
                conn.execute(f"LISTEN {PROBE_CHANNEL}")
                # What changed while nobody listened was not heard: start over.
                forget_all()
                pause = 0.5
                while not _stopping.is_set():
                    # Sent by another session, as every change is: a pooler that runs
                    # the listening session's statements on a server connection of the
                    # moment (PgBouncer's transaction mode) loses it as it would lose
                    # them, and the memory is never trusted.
                    probe = secrets.token_hex(8)
                    sent_at = time.monotonic()
                    sender.execute("SELECT pg_notify(%s, %s)", [PROBE_CHANNEL, probe])
                    for notify in conn.notifies(timeout=CONFIRM_EVERY):
                        if notify.channel != PROBE_CHANNEL:
                            forget_all()
                        elif notify.payload == probe:
                            # Delivered after every change committed before it: all of
                            # them have been heard.
                            _confirm(sent_at)
        except Exception:
            _unconfirm()
            forget_all()
            log.warning("api.access_cache_listener_lost", exc_info=True)
            _stopping.wait(pause)
            pause = min(pause * 2, 10.0)
    _unconfirm()
