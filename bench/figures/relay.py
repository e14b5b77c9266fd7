"""Figure 3: the outbox relay's publish rate over a backlog, and its lag after a burst."""

from __future__ import annotations

import time
from typing import Any

from bench.environment import wait_for
from bench.harness import Bench
from bench.table import Figure, say


def outbox_rows(bench: Bench, n: int) -> list[Any]:
    import uuid

    from jobs.models import OutboxEvent

    template = OutboxEvent.objects.order_by("-id").first()
    payload = dict(template.payload) if template else {"type": "agent.run.status.changed"}
    rows = []
    for i in range(n):
        p = dict(payload, id=str(uuid.uuid4()))
        rows.append(
            OutboxEvent(
                event_id=p["id"],
                type=p.get("type", "agent.run.status.changed"),
                partition_key=f"bench-{i % 1000}",
                payload=p,
            )
        )
    return rows


def relay_measure(bench: Bench) -> None:
    backlog = 2000 if bench.tiny else bench.args.backlog
    burst = 500 if bench.tiny else bench.args.burst
    say(f"relay: drain a backlog of {backlog} against inserting it; lag after a {burst} burst")
    from django.db import transaction

    from jobs.models import OutboxEvent
    from jobs.relay import outbox_drain, relay_wake

    if not OutboxEvent.objects.exists():
        bench.m_steps_minimal()  # a real event to copy
    rates, insert_rates, lags = [], [], []
    for _ in range(bench.reps):
        rows = outbox_rows(bench, backlog)
        started = time.monotonic()
        for i in range(0, len(rows), 1000):
            OutboxEvent.objects.bulk_create(rows[i : i + 1000])
        insert_rates.append(backlog / (time.monotonic() - started))
        started = time.monotonic()
        while outbox_drain().published:
            pass
        rates.append(backlog / (time.monotonic() - started))
        bench.broker_purge()
    worker = bench.worker(2)
    for _ in range(bench.reps):
        rows = outbox_rows(bench, burst)
        with transaction.atomic():
            OutboxEvent.objects.bulk_create(rows, batch_size=1000)
            transaction.on_commit(relay_wake)
        started = time.monotonic()
        wait_for(
            lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(),
            120,
            "outbox lag zero",
            every=0.05,
        )
        lags.append(time.monotonic() - started)
        # The consumers' share of the burst is not what is measured: drop it.
        bench.broker.delete("events")
    for child in worker:
        bench.procs.stop(child)
    bench.broker_purge()
    bench.table.add(
        Figure(
            f"3. relay publish, backlog {backlog:,}",
            "events/s",
            rates,
            insert_rates,
            "batch INSERT rows/s",
            ">= 0.3",
        )
    )
    bench.table.add(
        Figure(
            f"3. outbox lag to zero after {burst:,} burst",
            "s",
            lags,
            target="<= 10 s",
        )
    )
