"""The outbox's planner statistics, refreshed when a backlog waits that they miss.

The relay's claim (``jobs.sql.OUTBOX_BATCH_CLAIM``) is planned from PostgreSQL's
statistics of the outbox; ``outbox_statistics_refresh`` runs before each drain.
"""

from __future__ import annotations

import json
import time

from django.db import DatabaseError

from jobs import sql
from jobs.locks import sweep_lock
from jobs.logs import log
from jobs.models import OutboxEvent

# The outbox's statistics: a backlog is this many pending rows (counted up to it), and
# PostgreSQL's estimate of the pending rows must be at least a tenth of what was counted.
BACKLOG_ROWS = 1000
# One process analyses the outbox at most this often (another process, or autovacuum,
# may do it in between).
STATISTICS_REFRESH_SECONDS = 60.0
_statistics_refreshed_at = -STATISTICS_REFRESH_SECONDS


def outbox_statistics_refresh() -> bool:
    """Analyse the outbox when a backlog waits that PostgreSQL's statistics do not know
    of; whether it did.

    The claim's plan depends on how many rows the planner expects to be pending. Its
    statistics are a sample taken when the table was last analysed, which in a healthy
    system (autovacuum analysing as rows change) is when almost nothing is pending: it
    then expects one pending row and runs the claim's "no earlier pending row in the
    partition" as a scan of every pending row for each candidate, which is quadratic in
    a backlog. With 67,000 rows pending one claim took 6.9 s that way, and 3 ms once the
    table was analysed (a lookup of each candidate's partition in its index). A backlog
    is what a Redis outage or a burst leaves, and autovacuum analyses only after a tenth
    of the table has changed; so before a drain, a backlog of at least ``BACKLOG_ROWS``
    that the planner puts at less than a tenth of that is analysed, by one relay at a
    time and by each process at most every ``STATISTICS_REFRESH_SECONDS``. Analysing
    needs the table's owner (the role that migrates); refused, it is logged and the
    drain goes on.
    """
    global _statistics_refreshed_at
    if time.monotonic() - _statistics_refreshed_at < STATISTICS_REFRESH_SECONDS:
        return False
    pending = OutboxEvent.objects.filter(published_at__isnull=True)[:BACKLOG_ROWS].count()
    if pending < BACKLOG_ROWS or _pending_estimated() * 10 >= pending:
        return False
    _statistics_refreshed_at = time.monotonic()
    try:
        with sweep_lock("outbox-statistics") as held:
            # Another relay may have analysed it meanwhile.
            if not held or _pending_estimated() * 10 >= pending:
                return False
            sql.outbox_analyze()
    except DatabaseError:
        log.warning("relay.statistics_refresh_failed", exc_info=True)
        return False
    log.info(
        "relay.outbox_analyzed",
        pending_at_least=pending,
        pending_estimated=_pending_estimated(),
    )
    return True


def _pending_estimated() -> float:
    """How many pending rows PostgreSQL's planner expects in the outbox."""
    plan = OutboxEvent.objects.filter(published_at__isnull=True).explain(format="json")
    return float(json.loads(plan)[0]["Plan"]["Plan Rows"])
