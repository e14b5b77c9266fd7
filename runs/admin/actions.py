"""What every operator action shares: its record on the run's timeline, and the
links from a dead letter to the run or task it belongs to."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.urls import reverse

from jobs.admin.dead_letters import dead_letter_linker_register
from runs.models import Run, Task
from runs.timeline import event_record

OPERATOR_ACTION_EVENT = "agent.run.operator_action"


def _dead_letter_run_linker(task_name: str, name: str, value: Any) -> tuple[str, str] | None:
    """A dead letter's run (a step's first argument, or a ``run_id``) or task."""
    if not _is_uuid(str(value)):
        return None
    if name == "run_id" or (task_name == "runs.step" and name == "arg0"):
        run = Run.objects.filter(pk=value).only("id", "run_no").first()
        if run is not None:
            return str(run), reverse("admin:runs_run_change", args=[run.pk])
    if name == "task_id" and Task.objects.filter(pk=value).exists():
        return f"task {value}", reverse("admin:runs_task_change", args=[value])
    return None


dead_letter_linker_register(_dead_letter_run_linker)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def run_operator_action_record(
    *, run: Run, action: str, by: str, outcome: str, note: str = ""
) -> None:
    """Put an operator's action on the run's timeline, with the operator as actor."""
    with transaction.atomic():
        event_record(
            task=run.task,
            run=run,
            type=OPERATOR_ACTION_EVENT,
            data={
                "action": action,
                "by": by,
                "outcome": outcome,
                "note": note[:500],
                "via": "admin",
            },
            actor=by,
        )
