"""The base class for every Celery task: late acks, metrics, dead letters on exhaustion."""

from __future__ import annotations

import time
from typing import Any

from celery import Task
from celery.exceptions import Retry

from jobs.logs import log


class DurableTask(Task):
    """Acknowledged only after the work committed; exhausted retries become dead letters."""

    acks_late = True
    reject_on_worker_lost = True
    typing = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            log.debug(
                "task.finished",
                task=self.name,
                duration_ms=int((time.monotonic() - started) * 1000),
            )

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if isinstance(exc, Retry):
            return
        from jobs import metrics
        from jobs.services import dead_letter_record

        delivery = self.request.delivery_info or {}
        metrics.dead_letters.labels(self.name).inc()
        dead_letter_record(
            task_name=self.name,
            task_id=task_id,
            args=list(args or []),
            kwargs=dict(kwargs or {}),
            queue=delivery.get("routing_key", "") or "",
            exception=f"{type(exc).__name__}: {exc}",
            traceback=str(einfo),
            # Retries are the ones the task asked for; a redelivery after a worker died
            # (acks_late) is a crash recovery, counted apart.
            attempts=self.request.retries + 1,
            recoveries=1 if delivery.get("redelivered") else 0,
        )
