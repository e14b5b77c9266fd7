"""What a step gives back before it waits on its model or a CPU slot.

A model turn takes seconds; a step on the ``agent`` queue's threads pool spends most of
its life there, and much of the rest in sandboxed commands, which queue for one of the
host's few CPU slots. With a connection pool (``DATABASE_POOL``), the thread's
database connection goes back to the pool for each such wait, so the connections a
worker needs follow its database work, not the number of runs waiting on a model or a
slot (docs/capacity.md): a pool of 8 shared by 200 threads runs dry, and every statement
waits ``DATABASE_POOL_TIMEOUT`` for a connection, when threads keep theirs while they
queue for a slot. The next statement takes one again, from the pool (checked first, a
round trip: short waits such as a git command keep theirs). Without a pool, a
connection is a persistent one per thread and is kept: closing it would cost a new
connection per turn.
"""

from __future__ import annotations

from django.db import connections


def connections_release_for_wait() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block or not connection.settings_dict["OPTIONS"].get("pool"):
            continue
        connection.close()
