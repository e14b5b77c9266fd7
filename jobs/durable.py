"""The base class for every Celery task: late acks, transient retries, dead letters."""

from __future__ import annotations

import time
from typing import Any

from celery import Task
from celery.exceptions import Retry

from jobs import metrics
from jobs.backoff import backoff_delay
from jobs.dead_letters import dead_letter_record
from jobs.logs import log

# A job that met an outage retries this many times (about 10 minutes with backoff)
# before it counts as failed.
TRANSIENT_RETRIES = 12


def transient(exc: BaseException) -> bool:
    """True for a lost or refused connection to the database or the broker."""
    import django.db
    import kombu.exceptions
    import psycopg
    import redis.exceptions

    return isinstance(
        exc,
        (
            django.db.OperationalError,
            django.db.InterfaceError,
            psycopg.OperationalError,
            psycopg.InterfaceError,
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            kombu.exceptions.OperationalError,
            ConnectionError,
        ),
    )


class DurableTask(Task):
    """Acknowledged only after the work committed; exhausted retries become dead letters.

    A lost database or broker connection is an outage, not a failure of the job: it is
    retried with backoff (the broken connection closed first, so the retry reconnects)
    and never dead-lettered on its first attempt.

    ``reject_on_worker_lost`` requeues the message of a worker that died, forever if the
    message is what kills it. Only run steps keep it (the reaper counts their recoveries
    and fails the run when they are spent); sweeps are re-sent by beat and work items by
    the work sweep, which counts the deaths, so those tasks turn it off.
    """

    acks_late = True
    reject_on_worker_lost = True
    typing = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return super().__call__(*args, **kwargs)
        except Retry:
            raise
        except Exception as exc:
            if not transient(exc) or self.request.called_directly:
                raise
            from django.db import close_old_connections, connections

            for conn in connections.all(initialized_only=True):
                conn.close_if_unusable_or_obsolete()
            close_old_connections()
            retries = self.request.retries
            if retries >= TRANSIENT_RETRIES:
                raise
            log.warning("task.transient_error", task=self.name, error=str(exc)[:300])
            raise self.retry(
                exc=exc,
                countdown=backoff_delay(attempt=retries + 1, base=1.0, cap=120.0),
                max_retries=TRANSIENT_RETRIES,
            ) from exc
        finally:
            log.debug(
                "task.finished",
                task=self.name,
                duration_ms=int((time.monotonic() - started) * 1000),
            )

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if isinstance(exc, Retry):
            return

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
