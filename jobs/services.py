"""Dead letters: requeue, discard (recording them is ``jobs.dead_letters``)."""

from __future__ import annotations

from celery import current_app
from django.db import transaction
from django.utils import timezone

from jobs.models import DeadLetter
from jobs.work import work_enqueue, work_requeue


def dead_letter_requeue(*, letter: DeadLetter, by: str) -> bool:
    """Run the job again; False if the letter is not open.

    The work is recorded in the transaction that marks the letter requeued: a work
    item's own row is set pending again, any other job becomes a ``dead_letter.requeue``
    item that sends it. Either way a broker that refuses the wake-up loses nothing (the
    sweep wakes the row). Jobs are idempotent (receipts, step numbers), so requeueing
    one that partly ran is safe.
    """
    with transaction.atomic():
        updated = DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
            status=DeadLetter.Status.REQUEUED, resolved_at=timezone.now(), resolved_by=by
        )
        if updated and not work_requeue(letter):
            work_enqueue(
                kind="dead_letter.requeue",
                key=str(letter.pk),
                args={"letter_id": str(letter.pk)},
            )
    return bool(updated)


def requeued_task_send(*, letter_id: str) -> None:
    """Send a requeued letter's original Celery job with its original arguments."""
    letter = DeadLetter.objects.get(pk=letter_id)
    current_app.send_task(
        letter.task_name, args=letter.args, kwargs=letter.kwargs, queue=letter.queue or None
    )


def dead_letter_discard(*, letter: DeadLetter, by: str) -> bool:
    """Close the letter without running the job again; False if it is not open."""
    return bool(
        DeadLetter.objects.filter(pk=letter.pk, status=DeadLetter.Status.OPEN).update(
            status=DeadLetter.Status.DISCARDED, resolved_at=timezone.now(), resolved_by=by
        )
    )
