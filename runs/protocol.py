"""The step-handler contract (docs/design.md §7): what a handler gets, what it returns,
and how it stops or fails.

Step handlers (``runs.steps``) and the agent code import this module, never the engine:
the engine imports the handlers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.heartbeat import Heartbeat
from runs.lease import Lease, LeaseLost, lease_fenced
from runs.models import Run
from runs.timeline import PendingEvent, events_record

S = Run.Status

__all__ = [
    "Handler",
    "LeaseLost",
    "Outcome",
    "RunCancelled",
    "StepContext",
    "StepFailed",
    "TransientStepError",
]


class RunCancelled(Exception):
    """The step was told to stop (``should_stop``): a recorded cancellation request, or a
    lease it can no longer vouch for. Only the former ends the run (``_stopped_outcome``).
    """


class StepFailed(Exception):
    """A categorised, non-retryable failure: the run ends failed with ``reason``."""

    def __init__(self, reason: str, detail: str = "", *, status: str = S.FAILED) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.status = status


class TransientStepError(Exception):
    """Infrastructure trouble (network, provider 5xx): retry the step with backoff."""


@dataclass
class Outcome:
    """What a step decided: a transition (``to``) or staying put to continue."""

    to: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""
    # Wait for an outside decision instead of dispatching the next step at once.
    wait: bool = False
    # Nothing happened (e.g. an approval is still pending): release the lease only.
    noop: bool = False


class StepContext:
    """What a step handler works with: the run, its task, buffered events, durability."""

    def __init__(self, run: Run, lease: Lease) -> None:
        self.run = run
        self.task = run.task
        self.repository = run.task.repository
        self.lease = lease
        self.events: list[PendingEvent] = []
        self.checkpoint: dict[str, Any] = dict(run.checkpoint or {})
        self.heartbeat: Heartbeat | None = None
        # Callables run inside the commit transaction (rows that belong to the step).
        self._commit_writes: list[Callable[[], None]] = []
        self._after_commit: list[Callable[[], None]] = []
        # Until when (monotonic) a commit may keep the lease for the next step, and
        # whether the commit did (see step_execute).
        self.slice_end = float("-inf")
        self.lease_kept = False
        # The next step's lease and rows, when the commit that kept the lease loaded them.
        self.next_loaded: tuple[Lease, Run] | None = None

    @property
    def step_no(self) -> int:
        return self.lease.step_no

    def emit(self, type: str, data: dict[str, Any] | None = None, actor: str = "") -> None:
        self.events.append(PendingEvent(type=type, data=data or {}, actor=actor))

    def write_on_commit(self, write: Callable[[], None]) -> None:
        self._commit_writes.append(write)

    def after_commit(self, action: Callable[[], None]) -> None:
        self._after_commit.append(action)

    def should_stop(self) -> bool:
        return self.heartbeat.should_stop() if self.heartbeat else False

    def check_cancelled(self) -> None:
        """Raise RunCancelled if cancellation was requested; call before costly actions."""
        if self.heartbeat and self.heartbeat.lost:
            raise LeaseLost(f"lease on run {self.run.id} lost")
        if (self.heartbeat and self.heartbeat.cancelled) or Run.objects.filter(
            pk=self.run.id, cancel_requested_at__isnull=False
        ).exists():
            raise RunCancelled()

    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """A transaction for a mid-step checkpoint (e.g. an answered model turn).

        Commits only while the lease is ours; buffered events are flushed with it so the
        timeline never shows a fact whose rows were rolled back.
        """
        with transaction.atomic():
            if lease_fenced(self.lease).update(heartbeat_at=timezone.now()) != 1:
                raise LeaseLost(f"lease on run {self.run.id} lost")
            yield
            if self.events:
                events_record(task=self.task, run=self.run, events=self.events)
                self.events = []


Handler = Callable[[StepContext], Outcome]
