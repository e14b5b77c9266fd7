"""Priority classes, aging and the broker priority a run's step is dispatched at.

A task's ``priority`` is one of the classes below; a lower number is more urgent. A task
that waits grows more urgent: its effective priority is its class less one for every 30
minutes since it was submitted (``effective``). Re-admission of deferred tasks orders by
the effective priority (``readmission_order``), and every wake-up of a run's step is
published at the broker priority of its task's effective priority at that moment
(``broker_priority``), so aging applies again at each re-dispatch.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Protocol

from django.db.models import F, IntegerField
from django.db.models.expressions import RawSQL
from django.utils import timezone

EMERGENCY, SECURITY, INTERACTIVE, NORMAL, BATCH, MAINTENANCE = 0, 10, 50, 100, 200, 500
CLASSES: dict[str, int] = {
    "emergency": EMERGENCY,
    "security": SECURITY,
    "interactive": INTERACTIVE,
    "normal": NORMAL,
    "batch": BATCH,
    "maintenance": MAINTENANCE,
}
CHOICES = [(value, name) for name, value in CLASSES.items()]
DEFAULT = NORMAL
# Minutes of waiting that make a task one step more urgent.
AGING_MINUTES = 30

# kombu's Redis transport serves lower numbers first (0 is the bare queue name), 0 to 9.
# Two steps per class: the first for a workspace below its fair share while others have
# runs too (runs.fairness), the second otherwise. Batch and maintenance share the last
# pair; their order among themselves is decided at re-admission.
BROKER_PRIORITY_STEPS = list(range(10))
_BROKER_LEVELS = ((EMERGENCY, 0), (SECURITY, 2), (INTERACTIVE, 4), (NORMAL, 6))
_BROKER_LOWEST = 8


class PriorityInvalid(ValueError):
    pass


def parse(value: object) -> int:
    """A priority class from its number or its name (``"security"``, ``"10"``, ``10``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in CLASSES:
            return CLASSES[text]
        if text.lstrip("-").isdigit():
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool) and value in CLASSES.values():
        return value
    names = ", ".join(f"{n} ({v})" for n, v in CLASSES.items())
    raise PriorityInvalid(f"priority must be one of {names}")


def name_of(priority: int) -> str:
    for name, value in CLASSES.items():
        if value == priority:
            return name
    return str(priority)


def effective(base: int, waiting_since: datetime, now: datetime | None = None) -> int:
    """``base`` less one per ``AGING_MINUTES`` minutes waited since ``waiting_since``."""
    waited = ((now or timezone.now()) - waiting_since).total_seconds()
    return base - math.floor(max(waited, 0.0) / 60 / AGING_MINUTES)


def effective_expression(now: datetime | None = None) -> RawSQL:
    """``effective`` in SQL over tasks, at ``now`` (this process's clock, as ``effective``)."""
    return RawSQL(
        "runs_task.priority - FLOOR(GREATEST(EXTRACT(EPOCH FROM (%s::timestamptz"
        " - runs_task.created_at)), 0) / %s)::int",
        (now or timezone.now(), 60 * AGING_MINUTES),
        output_field=IntegerField(),
    )


def readmission_order() -> list[Any]:
    """The order deferred tasks are admitted in: most urgent effective priority, then the
    oldest."""
    return [effective_expression().asc(), F("created_at").asc()]


def broker_priority(effective_priority: int, *, under_share: bool = False) -> int:
    """The kombu message priority (0 first, 9 last) of a step at ``effective_priority``."""
    level = _BROKER_LOWEST
    for ceiling, step in _BROKER_LEVELS:
        if effective_priority <= ceiling:
            level = step
            break
    return level if under_share else level + 1


class _HasDefault(Protocol):
    default_priority: int


def submitted(value: object, repository: _HasDefault) -> int:
    """The class of a submitted task: the one named, else the repository's default."""
    if value is None or value == "":
        return repository.default_priority
    return parse(value)


LABEL_PREFIX = "agent:priority:"


def from_labels(labels: list[str]) -> int | None:
    """The class an issue's ``agent:priority:<class>`` label names (the most urgent if it
    has several); None without one."""
    found = []
    for label in labels:
        if label.lower().startswith(LABEL_PREFIX):
            try:
                found.append(parse(label[len(LABEL_PREFIX) :]))
            except PriorityInvalid:
                continue
    return min(found) if found else None
