"""Claiming a work item: a due item is leased; every other case is told apart (missing,
done, in flight, early, poison), and a claim after a dead worker's counts as its crash."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.models import WorkItem
from jobs.work_execution import _claim

pytestmark = pytest.mark.django_db

PENDING = WorkItem.Status.PENDING


def _item(**fields) -> WorkItem:
    values = {"kind": "k", "key": str(WorkItem.objects.count()), "queue": "events"}
    values.update({"due_at": timezone.now() - timedelta(seconds=1), **fields})
    return WorkItem.objects.create(**values)


def test_a_due_item_is_claimed() -> None:
    item = _item(attempts=2, wakes=3, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    claimed, why = _claim(item.pk)
    assert why == "claimed"
    assert claimed is not None
    row = WorkItem.objects.get(pk=item.pk)
    assert claimed.claim == row.claim != ""
    assert (claimed.attempts, claimed.crashes, row.attempts, row.wakes) == (3, 0, 3, 0)
    assert row.lease_until is not None and row.lease_until > timezone.now()
    assert (claimed.args, claimed.traceparent, claimed.kind) == (
        item.args,
        item.traceparent,
        item.kind,
    )


def test_a_claim_after_a_dead_workers_counts_its_crash() -> None:
    item = _item(lease_until=timezone.now() - timedelta(seconds=1), claim="old", crashes=1)
    claimed, why = _claim(item.pk)
    assert why == "claimed" and claimed is not None and claimed.crashes == 2
    assert WorkItem.objects.get(pk=item.pk).crashes == 2


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"status": WorkItem.Status.DONE}, "done"),
        ({"lease_until": timezone.now() + timedelta(hours=1), "claim": "x"}, "in_flight"),
        ({"due_at": timezone.now() + timedelta(hours=1)}, "early"),
    ],
)
def test_an_item_not_to_run_now_is_left_as_it_was(fields, why) -> None:
    item = _item(**fields)
    before = WorkItem.objects.filter(pk=item.pk).values().get()
    assert _claim(item.pk) == (None, why)
    assert WorkItem.objects.filter(pk=item.pk).values().get() == before


def test_a_missing_item_and_a_poison_item() -> None:
    assert _claim(10**9) == (None, "missing")
    item = _item(
        lease_until=timezone.now() - timedelta(seconds=1),
        claim="old",
        crashes=settings.WORK_POISON_CRASHES - 1,
    )
    assert _claim(item.pk) == (None, "poison")
    assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.DEAD
