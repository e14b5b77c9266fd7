"""Cluster-wide mutual exclusion for sweeps: a PostgreSQL advisory lock per sweep."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator

from django.db import transaction

from jobs import sql


@contextlib.contextmanager
def sweep_lock(name: str) -> Iterator[bool]:
    """Yields True if this process holds the sweep ``name`` for the transaction.

    Transaction-scoped (pg_try_advisory_xact_lock): released at commit or when the
    holder dies, so a crashed sweeper never blocks the next one.
    """
    with transaction.atomic():
        key = zlib.crc32(f"agentplatform:{name}".encode())
        yield sql.advisory_xact_lock_try(key)
