"""The baseline: a bare Celery app on the same broker, pool and acknowledgement settings."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

QUEUE = "rawbench"
app = Celery("rawbench", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
_redis = redis.Redis.from_url(os.environ["REDIS_URL"])


@app.task(name="raw.noop")
def noop() -> None:
    _redis.incr("bench:raw:done")


@app.task(name="raw.stamp")
def stamp(sent: float) -> None:
    _redis.rpush("bench:raw:latency", time.time() - sent)
