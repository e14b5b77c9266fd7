"""The outbox relay: publishes committed events at least once, in order per partition.

Woken on commit of new outbox rows (``relay_wake``) and swept by beat as a safety net.
Any number of relays may run at once:

* A relay claims the *head* row of each partition (the oldest pending row of a run)
  with ``SELECT ... FOR UPDATE SKIP LOCKED``. A row is a head only if no earlier row of
  its partition is pending, so holding a partition's head is holding the partition:
  another relay skips the locked head and cannot pick a later row of that partition.
* It then locks the partition's following pending rows, publishes them in id order
  (commit order for one run: events of a run are appended under the run's row lock)
  and marks them published in the same transaction. A relay killed between publishing
  and marking leaves the rows pending; they are published again, and the consumers'
  ProcessedEvent receipts absorb the duplicates.
* A publish failure moves the failed row's ``available_at`` into the future
  (exponential backoff with jitter). Until then the partition has no available head, so
  it waits without blocking any other partition.

Sinks, per event: the Redis Stream ``settings.EVENT_STREAM_NAME`` (CloudEvents JSON,
``XADD ... MAXLEN ~``), a Redis pub/sub wake-up on ``agent.run.<run id>`` for live
timelines, and the in-app consumers and workspace HTTP subscriptions: work items written
with the published mark (see jobs.work), one per consumer and batch of events, one per
subscription and event.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import metrics, outbox_statistics, redis_round, sql
from jobs.backoff import backoff_delay
from jobs.coalescing import coalescing_client as _coalescing_client
from jobs.consumers import CONSUME_BATCH, consume_key, consumers_for
from jobs.logs import log
from jobs.models import EventSubscription, OutboxEvent
from jobs.work import work_enqueue_many

# Rows per batch: each batch costs about ten round trips (claim, read, XADD pipeline,
# work items, mark, commit, wake-ups) whatever its size, so large batches amortise them.
BATCH_SIZE = 500
# Partitions claimed per batch: a run's events usually arrive a few at a time, so a
# batch spans many partitions; the row limit still caps the batch.
PARTITIONS_PER_BATCH = 250
_redis_clients: dict[str, Any] = {}


def run_channel(run_id: uuid.UUID | str) -> str:
    """The pub/sub channel a live timeline listens on for one run: ``RUN_CHANNEL_PREFIX``
    (it carries the Redis database's number) and the run's id."""
    return f"{settings.RUN_CHANNEL_PREFIX}{run_id}"


# Wake-up coalescing (Redis keys next to the broker's): "pending" says rows were committed
# since a relay last looked; "scheduled" says a relay task is queued or running and will
# look again. Without them every commit that records events sent a relay task (dozens per
# run), most of which found nothing left to publish.
RELAY_PENDING_KEY = "agentplatform:relay:pending"
RELAY_SCHEDULED_KEY = "agentplatform:relay:scheduled"
# Longer than any wait in the events queue should be; if a relay message is lost (queue
# purged, broker restarted) the next wake-up after this sends a new one, and the beat
# sweep publishes meanwhile.
RELAY_SCHEDULED_TTL_MS = 10_000
# The relay's own queue: thousands of consumer and delivery messages on "events" never
# stand in front of it. Every worker that consumes "events" consumes it too
# (agentplatform.celery), and the beat sweep still goes through "events".
RELAY_QUEUE = "relay"
OUTBOX_RELAY = "jobs.outbox_relay"  # the task (jobs.tasks), sent by name
# One relay task publishes for at most this long, then hands on to a fresh message, so a
# huge backlog does not hold one worker process for minutes.
RELAY_DRAIN_SECONDS = 20.0


def relay_wake(*, countdown: float | None = None, publish: tuple[str, str] | None = None) -> None:
    """Ask a worker to publish pending events (called on commit of new outbox rows).

    At most one relay task is queued or running at a time: a wake-up while one is makes
    that relay look again when it finishes, so under load one task drains many commits.

    ``publish``: a pub/sub message (channel, message) for the same Redis, sent in the
    same round trip (a step's announcement to the run's live views); lost, as it would
    be alone, when that Redis is unreachable.
    """
    if countdown is None:
        client = _coalescing_client()
        commands = [
            redis_round.command("set", RELAY_PENDING_KEY, 1, px=RELAY_SCHEDULED_TTL_MS),
            redis_round.command("set", RELAY_SCHEDULED_KEY, 1, nx=True, px=RELAY_SCHEDULED_TTL_MS),
        ]
        if publish is not None:
            commands.append(redis_round.command("publish", *publish))
        # With the other wake-ups of the same commit, in one round trip (redis_round).
        redis_round.send(client, commands, _relay_wake_coalesced)
        return
    _relay_send(countdown)


def _relay_wake_coalesced(outcome: list[Any] | Exception) -> None:
    """Send the relay task unless one is already scheduled (the NX set failed)."""
    error = redis_round.error_of(outcome, 2)
    if error is not None:  # no coalescing without Redis: send the task anyway
        log.warning("relay.coalesce_failed", error=repr(error))
    elif isinstance(outcome, list) and not outcome[1]:  # a relay is already scheduled
        return
    _relay_send(None)


def _relay_send(countdown: float | None) -> None:
    outbox_relay = current_app.tasks[OUTBOX_RELAY]
    try:
        # celery-stubs type countdown as float, but celery's own default is None.
        outbox_relay.apply_async(queue=RELAY_QUEUE, countdown=countdown)  # type: ignore[arg-type]
    except Exception:  # the beat sweep publishes what this wake-up would have
        log.warning("relay.wake_failed", exc_info=True)


def relay_wake_taken() -> None:
    """A relay starts draining: commits from now on must make it (or another) look again."""
    with contextlib.suppress(Exception):
        client = _coalescing_client()
        client.delete(RELAY_PENDING_KEY)


def relay_wake_done(*, more: bool = False) -> None:
    """A relay finished draining: look again after a short window if commits came meanwhile.

    The window batches the commits of a busy system into one task; an idle system is
    never kept waiting (its first wake-up sends a task at once). ``more``: the relay
    stopped at its time budget with rows left, so the next one starts at once.
    """
    outbox_relay = current_app.tasks[OUTBOX_RELAY]
    try:
        client = _coalescing_client()
        if more or client.get(RELAY_PENDING_KEY):
            client.pexpire(RELAY_SCHEDULED_KEY, RELAY_SCHEDULED_TTL_MS)
            outbox_relay.apply_async(
                queue=RELAY_QUEUE,
                # celery-stubs type countdown as float; None sends at once (no eta).
                countdown=None if more else settings.OUTBOX_RELAY_COALESCE_SECONDS,  # type: ignore[arg-type]
            )
            return
        client.delete(RELAY_SCHEDULED_KEY)
        # A wake-up between the read above and the delete saw "scheduled" and sent
        # nothing: it is this relay's to answer.
        if client.get(RELAY_PENDING_KEY):
            relay_wake()
    except Exception:  # the beat sweep publishes whatever this misses
        log.warning("relay.coalesce_failed", exc_info=True)


def relay_wake_reset() -> None:
    """Forget queued wake-ups (after purging the queues: no relay task is queued any more)."""
    with contextlib.suppress(Exception):
        client = _coalescing_client()
        client.delete(RELAY_PENDING_KEY, RELAY_SCHEDULED_KEY)


# --- sinks ---------------------------------------------------------------------------------


def stream_enabled() -> bool:
    """The stream is on unless its Redis URL is blank."""
    return bool(settings.EVENT_STREAM_REDIS_URL)


def stream_client() -> Any:
    """A Redis client for the stream, one connection pool per URL and process."""
    import redis

    url = settings.EVENT_STREAM_REDIS_URL
    client = _redis_clients.get(url)
    if client is None:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
        _redis_clients[url] = client
    return client


def stream_fields(row: OutboxEvent) -> dict[str, str]:
    """The stream entry: the structured CloudEvent plus routing fields for consumers."""
    return {
        "event": json.dumps(row.payload, separators=(",", ":"), sort_keys=True),
        "id": str(row.event_id),
        "type": row.type,
        "partition": row.partition_key,
    }


def stream_publish(rows: list[OutboxEvent]) -> list[Exception | None]:
    """XADD every row and wake live timelines, in one round trip; one result per row.

    A connection failure raises: every row failed. A per-command error (e.g. the key
    holds another type) fails only its row. Live timelines get one wake-up per run and
    batch (its last event): a view re-reads the timeline from the database, so one
    message says as much as several.
    """
    if not rows or not stream_enabled():
        return [None] * len(rows)
    pipe = stream_client().pipeline(transaction=False)
    last_of_run: dict[str, OutboxEvent] = {}
    for row in rows:
        pipe.xadd(
            settings.EVENT_STREAM_NAME,
            stream_fields(row),
            maxlen=settings.EVENT_STREAM_MAXLEN,
            approximate=True,
        )
        run_id = row.payload.get("runid")
        if run_id:
            last_of_run[run_id] = row
    for run_id, row in last_of_run.items():
        # A wake-up, not the event: a lost message costs latency, never data.
        # Same shape as the on-commit announcement (agentplatform.api.notify), plus
        # the event's id and type; this one also reaches a separate stream Redis.
        pipe.publish(
            run_channel(run_id),
            json.dumps(
                {
                    "run_id": run_id,
                    "sequence": row.payload.get("sequence"),
                    "id": str(row.event_id),
                    "type": row.type,
                }
            ),
        )
    results = pipe.execute(raise_on_error=False)
    # Only the XADDs decide; a failed PUBLISH is a missed wake-up.
    return [outcome if isinstance(outcome, Exception) else None for outcome in results[: len(rows)]]


@dataclass
class Deliveries:
    """The Celery messages one batch sends: consumers and HTTP subscriptions."""

    subscriptions: dict[int, list[EventSubscription]] = field(default_factory=dict)

    @classmethod
    def for_rows(cls, rows: Iterable[OutboxEvent]) -> Deliveries:
        workspaces = {row.payload.get("workspaceid") for row in rows} - {None}
        by_workspace: dict[int, list[EventSubscription]] = defaultdict(list)
        if workspaces:
            for sub in EventSubscription.objects.filter(
                workspace_id__in=[int(w) for w in workspaces], active=True
            ).order_by("pk"):
                by_workspace[sub.workspace_id].append(sub)
        return cls(subscriptions=dict(by_workspace))

    def work_for(self, rows: list[OutboxEvent]) -> dict[str, list[tuple[str, dict[str, Any], str]]]:
        """The rows' work items by kind: (key, args, trace).

        In-app consumers get one item per consumer and up to ``CONSUME_BATCH`` events (in
        id order, so in commit order per partition); a batch costs one wake-up and one
        claim instead of one per event. HTTP subscriptions get one item per event.
        """
        work: dict[str, list[tuple[str, dict[str, Any], str]]] = {
            "event.consume": [],
            "subscription.deliver": [],
        }
        by_consumer: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for row in rows:
            event_id = str(row.event_id)
            trace = str(row.payload.get("traceparent") or "")
            for consumer in consumers_for(row.type):
                by_consumer[consumer.name].append((event_id, trace))
            workspace = row.payload.get("workspaceid")
            for sub in self.subscriptions.get(int(workspace), []) if workspace else []:
                if sub.wants(row.type):
                    work["subscription.deliver"].append(
                        (
                            f"{sub.pk}:{event_id}",
                            {"subscription_id": sub.pk, "event_id": event_id},
                            trace,
                        )
                    )
        for name, events in by_consumer.items():
            for start in range(0, len(events), CONSUME_BATCH):
                chunk = events[start : start + CONSUME_BATCH]
                ids = [event_id for event_id, _ in chunk]
                args: dict[str, Any] = (
                    {"consumer": name, "event_id": ids[0]}
                    if len(ids) == 1
                    else {"consumer": name, "event_ids": ids}
                )
                work["event.consume"].append((consume_key(name, ids), args, chunk[0][1]))
        return work


# --- the relay -----------------------------------------------------------------------------


def _batch_claim(
    *, now: datetime, partitions: int, limit: int
) -> tuple[list[OutboxEvent], Deliveries]:
    """Lock up to ``partitions`` partitions and their pending rows (up to ``limit``, in id
    order, ``jobs.sql.OUTBOX_BATCH_CLAIM``); the rows and the HTTP subscriptions of their
    workspaces."""
    rows = list(OutboxEvent.objects.raw(sql.OUTBOX_BATCH_CLAIM, [now, partitions, limit]))
    if not rows:
        return [], Deliveries()
    return rows, Deliveries.for_rows(rows)


@dataclass
class BatchReport:
    published: int = 0
    failed_partitions: int = 0
    claimed: int = 0
    retry_at: datetime | None = None
    # The drain stopped at its limit while still publishing.
    more: bool = False
    # The batch stopped at its row or partition limit: more rows may be available.
    full: bool = False


def outbox_relay_batch(
    *, limit: int = BATCH_SIZE, partitions: int = PARTITIONS_PER_BATCH
) -> BatchReport:
    """Publish one batch of pending events, in order per partition, and mark them.

    Claim, publish and mark happen in one transaction: a crash before the commit leaves
    the rows pending (published again later, absorbed downstream), never lost.
    """
    report = BatchReport()
    now = timezone.now()
    with transaction.atomic():
        # The heads are ours, so nobody else locks these partitions' rows. Ordering by id
        # and cutting at ``limit`` keeps each partition's share a prefix of its pending
        # rows.
        rows, deliveries = _batch_claim(now=now, partitions=partitions, limit=limit)
        if not rows:
            return report
        report.claimed = len(rows)
        report.full = len(rows) >= limit or len({r.partition_key for r in rows}) >= partitions
        started = time.monotonic()
        published, failed = _publish(rows, deliveries)
        if published:
            _published_mark([r.pk for r in published])
        for row, exc in failed:
            attempt = row.attempts + 1
            delay = backoff_delay(
                attempt=attempt,
                base=settings.OUTBOX_RETRY_BASE_SECONDS,
                cap=settings.OUTBOX_RETRY_MAX_SECONDS,
            )
            retry_at = timezone.now() + timedelta(seconds=delay)
            OutboxEvent.objects.filter(pk=row.pk).update(
                attempts=attempt,
                last_error=f"{type(exc).__name__}: {exc}"[:1000],
                available_at=retry_at,
            )
            report.retry_at = min(filter(None, [report.retry_at, retry_at]))
        metrics.relay_publish_seconds.observe(time.monotonic() - started)
    report.published = len(published)
    report.failed_partitions = len(failed)
    if published:
        metrics.events_published.inc(len(published))
    if failed:
        metrics.publish_failures.inc(len(failed))
        log.warning(
            "relay.publish_failed",
            partitions=len(failed),
            error=f"{type(failed[0][1]).__name__}: {failed[0][1]}"[:300],
        )
    return report


def _published_mark(ids: list[int]) -> None:
    OutboxEvent.objects.filter(pk__in=ids).update(
        published_at=timezone.now(), attempts=F("attempts") + 1, last_error=""
    )


def _publish(
    rows: list[OutboxEvent], deliveries: Deliveries
) -> tuple[list[OutboxEvent], list[tuple[OutboxEvent, Exception]]]:
    """Send rows to every sink; the published rows and each failed partition's first row.

    Within a partition, a failure stops the rows after it (order); other partitions go on.
    """
    try:
        stream_results = stream_publish(rows)
    except Exception as exc:  # the stream is unreachable: every partition waits
        heads: dict[str, OutboxEvent] = {}
        for row in rows:
            heads.setdefault(row.partition_key, row)
        return [], [(row, exc) for row in heads.values()]
    # In-app deliveries are rows written in this transaction, with the rows marked
    # published: a wake-up lost with the broker loses no delivery (the work sweep
    # re-sends it), and a rolled-back batch leaves neither.
    published: list[OutboxEvent] = []
    failed: dict[str, tuple[OutboxEvent, Exception]] = {}
    for row, stream_error in zip(rows, stream_results, strict=True):
        if row.partition_key in failed:
            continue
        if stream_error is not None:
            failed[row.partition_key] = (row, stream_error)
            continue
        published.append(row)
    for kind, entries in deliveries.work_for(published).items():
        work_enqueue_many(kind=kind, entries=entries)
    return published, list(failed.values())


def outbox_drain(
    *, max_batches: int = 1000, max_seconds: float | None = None, caught_up: bool = False
) -> BatchReport:
    """Publish until nothing is available, or ``max_batches``, or ``max_seconds`` have
    passed (then ``more`` is set: rows may be left); the summed report.

    ``caught_up``: stop after a batch that was not full, having published every row that
    was available when it claimed them. Rows committed meanwhile wait for the next drain:
    under load, a drain that went on picked up a few rows per batch, each batch costing
    the same round trips, so the relay spent more per event the busier it was.
    """
    total = BatchReport()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    outbox_statistics.outbox_statistics_refresh()
    for _ in range(max_batches):
        report = outbox_relay_batch()
        total.published += report.published
        total.failed_partitions += report.failed_partitions
        total.claimed += report.claimed
        if report.retry_at is not None:
            total.retry_at = min(filter(None, [total.retry_at, report.retry_at]))
        if report.published == 0 or (caught_up and not report.full):
            return total
        if deadline is not None and time.monotonic() >= deadline:
            break
    total.more = True
    return total


def outbox_lag_seconds() -> float:
    """Age of the oldest pending event; 0 when the outbox is drained."""
    oldest = (
        OutboxEvent.objects.filter(published_at__isnull=True)
        .order_by("id")
        .values_list("created_at", flat=True)
        .first()
    )
    return max(0.0, (timezone.now() - oldest).total_seconds()) if oldest else 0.0


def outbox_pending_count() -> int:
    return OutboxEvent.objects.filter(published_at__isnull=True).count()
