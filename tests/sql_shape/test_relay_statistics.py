"""A backlog the planner does not know of: the relay analyses the outbox before it claims.

Analysed while nothing was pending (as autovacuum leaves a healthy outbox), PostgreSQL
expects one pending row and plans the claim's "no earlier pending row in the partition"
as a scan of every pending row per candidate: quadratic in a backlog. Once analysed, it
looks each candidate's partition up in its index.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

import jobs.outbox_statistics
import jobs.relay
from jobs.models import OutboxEvent
from jobs.outbox_statistics import BACKLOG_ROWS, outbox_statistics_refresh
from jobs.relay import outbox_drain
from jobs.sql import OUTBOX_BATCH_CLAIM

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.sql_shape]

PARTITIONS = 300


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # As in a process that has not analysed the outbox yet.
    monkeypatch.setattr(jobs.outbox_statistics, "_statistics_refreshed_at", -1e9)
    yield


def _rows(n: int, *, published: bool) -> list[OutboxEvent]:
    now = timezone.now()
    return [
        OutboxEvent(
            event_id=uuid.uuid4(),
            type="agent.run.status.changed",
            partition_key=f"run-{i % PARTITIONS}",
            payload={"specversion": "1.0", "type": "agent.run.status.changed"},
            published_at=now if published else None,
        )
        for i in range(n)
    ]


def _analysed_while_nothing_was_pending() -> None:
    OutboxEvent.objects.bulk_create(_rows(500, published=True))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxEvent._meta.db_table}")


def _backlog(n: int) -> None:
    OutboxEvent.objects.bulk_create(_rows(n, published=False), batch_size=1000)


def _claim_probes_the_partition_index() -> bool:
    """Whether the claim's plan looks each candidate's partition up in the partition
    index (an index condition on the partition key), rather than scanning pending rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + OUTBOX_BATCH_CLAIM,
            [timezone.now(), jobs.relay.PARTITIONS_PER_BATCH, jobs.relay.BATCH_SIZE],
        )
        (plan,) = cursor.fetchone()

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    return any(
        node.get("Index Name") == "outbox_pending_partition"
        and "partition_key" in node.get("Index Cond", "")
        for node in nodes(plan[0]["Plan"])
    )


def _analyses() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_analyze_count(%s::regclass)", [OutboxEvent._meta.db_table]
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_a_backlog_the_statistics_miss_is_analysed_and_claimed_through_the_index() -> None:
    _analysed_while_nothing_was_pending()
    _backlog(3 * BACKLOG_ROWS)
    assert not _claim_probes_the_partition_index()  # what a backlog met before

    assert outbox_statistics_refresh()

    assert _claim_probes_the_partition_index()
    assert not outbox_statistics_refresh()  # known now: nothing more to do


def test_a_drain_analyses_a_backlog_before_it_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    _analysed_while_nothing_was_pending()
    _backlog(2 * BACKLOG_ROWS)
    monkeypatch.setattr(jobs.relay, "stream_publish", lambda rows: [None] * len(rows))
    analyses = _analyses()

    report = outbox_drain()

    assert report.published == 2 * BACKLOG_ROWS
    assert _analyses() == analyses + 1


def test_a_small_backlog_or_one_the_statistics_know_is_left_alone() -> None:
    _analysed_while_nothing_was_pending()
    _backlog(BACKLOG_ROWS - 1)
    assert not outbox_statistics_refresh()
    _backlog(BACKLOG_ROWS)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxEvent._meta.db_table}")
    analyses = _analyses()

    assert not outbox_statistics_refresh()
    assert _analyses() == analyses


def test_a_process_analyses_at_most_once_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    _analysed_while_nothing_was_pending()
    _backlog(BACKLOG_ROWS)
    assert outbox_statistics_refresh()
    with connection.cursor() as cursor:  # the statistics go stale again at once
        cursor.execute(
            f"UPDATE {OutboxEvent._meta.db_table} SET published_at = now()"  # noqa: S608
        )
        cursor.execute(f"ANALYZE {OutboxEvent._meta.db_table}")
    OutboxEvent.objects.filter(published_at__isnull=False).update(published_at=None)

    assert not outbox_statistics_refresh()
