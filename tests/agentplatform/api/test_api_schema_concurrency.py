"""The schema endpoint under concurrent first requests: generated one at a time, no 5xx."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_schema_requests_are_generated_one_at_a_time(monkeypatch):
    lock = threading.Lock()
    state = {"active": 0, "peak": 0}
    generate = SchemaGenerator.get_schema

    def counting(self, *args, **kwargs):
        with lock:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
        try:
            time.sleep(0.2)  # long enough for every thread to arrive meanwhile
            return generate(self, *args, **kwargs)
        finally:
            with lock:
                state["active"] -= 1

    monkeypatch.setattr(SchemaGenerator, "get_schema", counting)
    statuses: list[int] = []
    barrier = threading.Barrier(4)

    def fetch() -> None:
        try:
            barrier.wait(timeout=10)
            statuses.append(Client().get("/api/schema/").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert statuses == [200, 200, 200, 200]
    assert state["peak"] == 1
