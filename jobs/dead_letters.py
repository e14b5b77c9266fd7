"""Dead letters: recording a job that exhausted its retries, and who hears of it.

The bottom of the delivery layer: the durable task base and the work items record
their dead letters here; requeueing and discarding them is in ``jobs.services``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.logs import log
from jobs.models import DeadLetter, OutboxEvent

DeadLetterListener = Callable[[DeadLetter], None]
_listeners: list[DeadLetterListener] = []


def dead_letter_listener_register(listener: DeadLetterListener) -> None:
    """Call ``listener(letter)`` inside the transaction that records each dead letter.

    The domain apps say there what a dead letter means to them (an event on a timeline,
    a run that can no longer finish); a listener may update and save the letter.
    """
    if listener not in _listeners:
        _listeners.append(listener)


def dead_letter_record(
    *,
    task_name: str,
    task_id: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str,
    exception: str,
    traceback: str,
    attempts: int,
    recoveries: int = 0,
) -> DeadLetter:
    """Record a job that exhausted its retries (or failed for good); listeners announce it."""
    now = timezone.now()
    with transaction.atomic():
        letter = DeadLetter.objects.filter(task_id=task_id, status=DeadLetter.Status.OPEN).first()
        if letter is None:
            letter = DeadLetter(task_name=task_name, task_id=task_id, first_failed_at=now)
        letter.args, letter.kwargs, letter.queue = args, kwargs, queue
        letter.exception, letter.traceback = exception[:5000], traceback[-20000:]
        letter.attempts, letter.last_failed_at = attempts, now
        letter.recoveries = recoveries
        letter.workspace_id = _workspace_of_event_job(kwargs)
        letter.save()
        for listener in _listeners:
            listener(letter)
    log.error("job.dead_lettered", task=task_name, task_id=task_id, exception=exception[:300])
    return letter


def _workspace_of_event_job(kwargs: dict[str, Any]) -> int | None:
    """The workspace of the event a delivery was handling (none for other jobs)."""
    event_id = kwargs.get("event_id")
    if not event_id:
        return None
    payload = (
        OutboxEvent.objects.filter(event_id=str(event_id)).values_list("payload", flat=True).first()
    )
    workspace = (payload or {}).get("workspaceid")
    return int(workspace) if workspace else None
