"""A run's wake-up message reads as Celery would have written it: the arguments' repr
given with it is the one Celery's safe repr makes (monitoring shows it), and no more."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import signals
from celery.utils.saferepr import saferepr

from runs.dispatch import run_wake

# A wake-up reads its run's priority class (runs.fairness).
pytestmark = pytest.mark.django_db


def test_the_wake_up_carries_celerys_own_repr_of_its_arguments() -> None:
    published: list[dict[str, Any]] = []

    def capture(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
        published.append(dict(headers or {}))

    signals.before_task_publish.connect(capture, weak=False)
    try:
        run_id = uuid.uuid4()
        run_wake(run_id=run_id, step_no=3)
    finally:
        signals.before_task_publish.disconnect(capture)
    (headers,) = published
    assert headers["task"] == "runs.step"
    assert headers["argsrepr"] == saferepr((str(run_id), 3))
    assert headers["kwargsrepr"] == saferepr({})
