"""What a run put on its outgoing event stream, checked against the published contracts."""

from __future__ import annotations

from typing import Any

from jobs.models import OutboxEvent
from runs.models import Run
from tests.runs.test_event_contracts import _assert_contract


def assert_contracts(run: Run, event_type: str) -> list[dict[str, Any]]:
    """Every ``event_type`` event of the run, each valid against docs/events; at least one."""
    payloads = list(
        OutboxEvent.objects.filter(type=event_type, payload__runid=str(run.id)).values_list(
            "payload", flat=True
        )
    )
    assert payloads, f"no {event_type} event for run {run.id}"
    for payload in payloads:
        _assert_contract(payload)
    return payloads
