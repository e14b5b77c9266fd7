"""Outbox lag (the age of the oldest pending event) is exposed to the metrics."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.db import transaction
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from agentplatform.metrics_endpoint import exposition
from jobs.relay import outbox_drain, outbox_lag_seconds
from runs.models import Run
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)
T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


def test_outbox_lag_is_the_age_of_the_oldest_pending_event(workspace):
    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    with time_machine.travel(T0, tick=False):
        assert outbox_lag_seconds() == 0
        with transaction.atomic():
            events_record(
                task=task, run=run, events=[PendingEvent("agent.run.started", {"run_no": 1})]
            )
    with time_machine.travel(T0 + dt.timedelta(seconds=42), tick=False):
        assert outbox_lag_seconds() == 42
        assert _scraped("agent_outbox_lag_seconds") == 42
        assert _scraped("agent_outbox_pending") == 1
        with override_settings(EVENT_STREAM_NAME="test_h4.lag", EVENT_CONSUMERS=[]):
            outbox_drain()
        assert _scraped("agent_outbox_lag_seconds") == 0


def _scraped(name: str) -> float:
    for family in text_string_to_metric_families(exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not exposed")
