"""Re-delivery and backfill: recorded events handed again to ONE consumer or subscription.

An operator names the target (a consumer of ``EVENT_CONSUMERS`` by name, or an HTTP
subscription as ``subscription:<id>``) and a source of envelopes in their original
order: the outbox here (``outbox_envelopes``), or a domain app's own history (the runs
app rebuilds envelopes from its timeline when the outbox rows are pruned). Each event
goes through the target's normal path and idempotency guard, the ProcessedEvent
receipt ``(consumer, event_id)`` written in the transaction of its side effect: an
event the target already handled is a duplicate and changes nothing, so a re-delivery
can be repeated, stopped and resumed, and a new consumer is backfilled by re-delivering
history to it. ``redelivery_count`` is the dry run: what would be delivered, nothing is.

Generic: this module knows envelopes and consumers, no domain type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from django.db.models import Q

from jobs.consumers import PermanentConsumerError, _consume_one, consumers_registered
from jobs.models import EventSubscription, OutboxEvent, ProcessedEvent
from jobs.subscriptions import consumer_name, subscription_deliver

CHUNK = 500
SUBSCRIPTION_PREFIX = "subscription:"


@dataclass(frozen=True)
class Target:
    """Where events are re-delivered: its receipt name, its filter and its delivery."""

    name: str
    wants: Callable[[str], bool]
    deliver: Callable[[str, dict[str, Any]], str]


def target_for(name: str) -> Target:
    """The consumer or subscription ``name`` names; PermanentConsumerError if none."""
    if name.startswith(SUBSCRIPTION_PREFIX):
        try:
            sub = EventSubscription.objects.get(pk=int(name.removeprefix(SUBSCRIPTION_PREFIX)))
        except (ValueError, EventSubscription.DoesNotExist) as exc:
            raise PermanentConsumerError(f"no subscription {name!r}") from exc
        return Target(
            name=consumer_name(sub.pk),
            wants=sub.wants,
            deliver=lambda event_id, payload: subscription_deliver(
                subscription_id=sub.pk, event_id=event_id, payload=payload
            ),
        )
    spec = consumers_registered().get(name)
    if spec is None:
        raise PermanentConsumerError(f"no consumer named {name!r}")
    return Target(
        name=spec.name,
        wants=spec.wants,
        deliver=lambda event_id, payload: _consume_one(spec, event_id, payload=payload),
    )


def outbox_envelopes(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    partition_key: str | None = None,
    workspace_id: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The outbox's envelopes in commit order (id), read in keyset pages."""
    query = Q()
    if since is not None:
        query &= Q(created_at__gte=since)
    if until is not None:
        query &= Q(created_at__lt=until)
    if partition_key is not None:
        query &= Q(partition_key=partition_key)
    if workspace_id is not None:
        query &= Q(payload__workspaceid=str(workspace_id))
    last = 0
    while True:
        page = list(
            OutboxEvent.objects.filter(query, id__gt=last)
            .order_by("id")
            .values_list("id", "payload")[:CHUNK]
        )
        for _, payload in page:
            yield payload
        if len(page) < CHUNK:
            return
        last = page[-1][0]


def _chunks(envelopes: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    iterator = iter(envelopes)
    while chunk := list(islice(iterator, CHUNK)):
        yield chunk


def _wanted_and_done(target: Target, chunk: list[dict[str, Any]]) -> tuple[list[dict], set[str]]:
    wanted = [e for e in chunk if target.wants(str(e.get("type", "")))]
    done = {
        str(e)
        for e in ProcessedEvent.objects.filter(
            consumer=target.name, event_id__in=[str(e["id"]) for e in wanted]
        ).values_list("event_id", flat=True)
    }
    return wanted, done


@dataclass
class RedeliveryReport:
    """What a re-delivery (or its dry run) found and did."""

    target: str
    events: int = 0  # read from the source
    wanted: int = 0  # of a type the target takes
    already_processed: int = 0  # the target's receipt existed before
    delivered: int = 0
    duplicates: int = 0  # a receipt appeared meanwhile (a concurrent delivery)
    gone: int = 0  # the subscription was deactivated meanwhile
    failed: str = ""  # the error that stopped the re-delivery, with the event id
    by_type: dict[str, int] = field(default_factory=dict)

    @property
    def to_deliver(self) -> int:
        return self.wanted - self.already_processed


def redelivery_count(*, target: str, envelopes: Iterable[dict[str, Any]]) -> RedeliveryReport:
    """The dry run: how many events ``target`` would be handed; nothing is delivered."""
    spec = target_for(target)
    report = RedeliveryReport(target=spec.name)
    for chunk in _chunks(envelopes):
        wanted, done = _wanted_and_done(spec, chunk)
        report.events += len(chunk)
        report.wanted += len(wanted)
        report.already_processed += len(done)
        for e in wanted:
            if str(e["id"]) not in done:
                report.by_type[e["type"]] = report.by_type.get(e["type"], 0) + 1
    return report


def redeliver(
    *,
    target: str,
    envelopes: Iterable[dict[str, Any]],
    progress: Callable[[int], None] | None = None,
) -> RedeliveryReport:
    """Hand each event ``target`` takes and has not handled to it, in order, once.

    Stops at the first event whose delivery raises (``failed`` says which): what came
    before it stays delivered, and running the same re-delivery again resumes there.
    """
    spec = target_for(target)
    report = RedeliveryReport(target=spec.name)
    for chunk in _chunks(envelopes):
        wanted, done = _wanted_and_done(spec, chunk)
        report.events += len(chunk)
        report.wanted += len(wanted)
        report.already_processed += len(done)
        for payload in wanted:
            event_id = str(payload["id"])
            if event_id in done:
                continue
            try:
                outcome = spec.deliver(event_id, payload)
            except Exception as exc:
                report.failed = f"{event_id}: {type(exc).__name__}: {exc}"[:500]
                return report
            if outcome in ("processed", "delivered"):
                report.delivered += 1
                report.by_type[payload["type"]] = report.by_type.get(payload["type"], 0) + 1
            elif outcome == "gone":
                report.gone += 1
            else:
                report.duplicates += 1
        if progress is not None:
            progress(len(chunk))
    return report
