"""What a step gives back before it waits on its model.

A model turn takes seconds; a step on the ``agent`` queue's threads pool spends most of
its life there. With a connection pool (``DATABASE_POOL``), the thread's database
connection goes back to the pool for the wait, so the connections a worker needs follow
its database work, not the number of runs waiting on a model (docs/capacity.md). The
next statement takes one again, from the pool. Without a pool, a connection is a
persistent one per thread and is kept: closing it would cost a new connection per turn.
"""

from __future__ import annotations

from django.db import connections


def connections_release_for_wait() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block or not connection.settings_dict["OPTIONS"].get("pool"):
            continue
        connection.close()
