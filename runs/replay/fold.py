"""Rebuild and consistency check: a run's state recomputed from its timeline alone.

``run_rebuild`` folds the run's events (status from ``agent.run.status.changed``,
tokens and cost from ``agent.model.turn.completed``, the failure from the terminal
event, patches, cancellation, the last sequence number) and ``run_check`` compares the
fold with the stored Run row: every field that differs is drift. ``step_no`` is not a
fact of the timeline (a step that changes nothing emits nothing), so the fold gives a
lower bound for it: one step per status change.

Events are immutable, so the fold of a prefix of the timeline never changes: every
``SNAPSHOT_EVERY`` events it is stored (RunFoldSnapshot), and a rebuild starts from the
newest snapshot of the current fold ``VERSION`` and reads only the events after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from runs.models import ModelTurn, Patch, Run, RunEvent, RunFoldSnapshot

# Bump when _apply changes meaning: older snapshots are then ignored.
VERSION = 2
SNAPSHOT_EVERY = 200
CENTS = Decimal("0.000001")
TERMINAL_EVENTS = {
    "agent.run.completed",
    "agent.run.failed",
    "agent.run.cancelled",
    "agent.run.timed_out",
}


def _initial() -> dict[str, Any]:
    return {
        "status": Run.Status.QUEUED.value,
        "transitions": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_usd": "0",
        "turns": 0,
        "seeded_turns": 0,
        "patches": 0,
        "failure_reason": "",
        "failure_detail": "",
        "cancel_requested": False,
        "last_sequence_no": 0,
    }


def _apply(state: dict[str, Any], run_id: str, type: str, data: dict[str, Any]) -> None:
    if type == "agent.run.status.changed":
        state["status"] = data.get("to", state["status"])
        state["transitions"] += 1
    elif type == "agent.model.turn.completed":
        state["tokens_in"] += int(data.get("tokens_in") or 0)
        state["tokens_out"] += int(data.get("tokens_out") or 0)
        # Stored per turn at six places (PostgreSQL rounds half away from zero), and the
        # run's total is the sum of those stored values.
        cost = Decimal(str(data.get("cost_usd", 0))).quantize(CENTS, ROUND_HALF_UP)
        state["cost_usd"] = str(Decimal(state["cost_usd"]) + cost)
        state["turns"] += 1
    elif type == "agent.patch.created":
        state["patches"] += 1
    elif type == "agent.run.cancel.requested":
        state["cancel_requested"] = True
    elif type in TERMINAL_EVENTS:
        state["failure_reason"] = data.get("reason", "") if type != "agent.run.completed" else ""
        state["failure_detail"] = data.get("detail", "")
    elif type == "agent.run.forked" and data.get("fork_run_id") == run_id:
        # The fork's reused turns are checkpoints without events of their own.
        state["seeded_turns"] = int(data.get("turn") or 0)


@dataclass
class Rebuild:
    state: dict[str, Any]
    events_folded: int
    from_snapshot: int  # the sequence number the fold started after (0: the beginning)


def run_rebuild(run: Run, *, snapshot_every: int = SNAPSHOT_EVERY) -> Rebuild:
    """The run's state folded from its events, from the newest snapshot on."""
    snapshot = (
        RunFoldSnapshot.objects.filter(run=run, version=VERSION).order_by("-sequence_no").first()
    )
    state = dict(snapshot.state) if snapshot else _initial()
    start = snapshot.sequence_no if snapshot else 0
    events: Iterable[tuple[int, str, dict[str, Any]]] = (
        RunEvent.objects.filter(run=run, sequence_no__gt=start)
        .order_by("sequence_no")
        .values_list("sequence_no", "type", "data")
        .iterator(chunk_size=1000)
    )
    folded = 0
    snapshots: list[RunFoldSnapshot] = []
    run_id = str(run.id)
    for sequence_no, type, data in events:
        _apply(state, run_id, type, data or {})
        state["last_sequence_no"] = sequence_no
        folded += 1
        if snapshot_every and sequence_no % snapshot_every == 0:
            snapshots.append(
                RunFoldSnapshot(
                    run=run, sequence_no=sequence_no, version=VERSION, state=dict(state)
                )
            )
    if snapshots:
        RunFoldSnapshot.objects.bulk_create(snapshots, ignore_conflicts=True)
    return Rebuild(state=state, events_folded=folded, from_snapshot=start)


@dataclass
class Drift:
    run_id: str
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name: (stored, folded)

    @property
    def drifted(self) -> bool:
        return bool(self.fields)


def _stored(run: Run) -> dict[str, Any]:
    return {
        "status": run.status,
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
        "cost_usd": Decimal(run.cost_usd).quantize(CENTS),
        "turns": ModelTurn.objects.filter(run=run).count(),
        "patches": Patch.objects.filter(run=run).count(),
        "failure_reason": run.failure_reason,
        "failure_detail": run.failure_detail[:500],
        "cancel_requested": run.cancel_requested_at is not None,
        "last_sequence_no": run.last_sequence_no,
    }


def run_check(run: Run, *, snapshot_every: int = SNAPSHOT_EVERY) -> Drift:
    """Where the stored run differs from the fold of its timeline (empty: consistent)."""
    state = run_rebuild(run, snapshot_every=snapshot_every).state
    folded = {
        **{k: state[k] for k in _initial() if k not in ("transitions", "seeded_turns")},
        "cost_usd": Decimal(state["cost_usd"]).quantize(CENTS),
        "turns": state["turns"] + state["seeded_turns"],
        "failure_detail": state["failure_detail"][:500],
    }
    drift = Drift(run_id=str(run.id))
    for name, value in _stored(run).items():
        if folded[name] != value:
            drift.fields[name] = (value, folded[name])
    if run.step_no < state["transitions"]:
        drift.fields["step_no"] = (run.step_no, f">= {state['transitions']}")
    return drift
