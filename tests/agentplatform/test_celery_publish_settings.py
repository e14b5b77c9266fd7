"""Every setting Celery reads while publishing is one of ours, so no read falls through
Django's settings to Celery's defaults (a caught AttributeError per key and publish)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.utils import collections as celery_collections
from django.conf import settings

pytestmark = pytest.mark.services


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    original = celery_collections.ConfigurationView.__getitem__

    def recording(self: Any, key: str) -> Any:
        seen.append(key)
        return original(self, key)

    monkeypatch.setattr(celery_collections.ConfigurationView, "__getitem__", recording)
    yield seen


def test_a_publish_reads_only_settings_we_set(own_redis, broker_at, reads) -> None:
    from agentplatform.celery import app

    broker_at(own_redis.url)

    def publish(n: int) -> None:
        with app.producer_or_acquire() as producer:
            app.send_task("jobs.noop", args=(n,), queue="config-reads", producer=producer)

    publish(0)  # the first publish builds the pools and the routes
    reads.clear()
    publish(1)
    publish(2)

    assert reads, "the recorder saw Celery's reads"
    unset = sorted({key for key in reads if not hasattr(settings, f"CELERY_{key.upper()}")})
    assert unset == []
