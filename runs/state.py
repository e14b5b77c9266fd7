"""The run state machine, declared once. Every status change goes through here."""

from __future__ import annotations

from runs.models import Run

S = Run.Status

TERMINAL: frozenset[str] = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
ACTIVE: frozenset[str] = frozenset(set(S.values) - TERMINAL)
# States in which the run waits for a person, not for a worker: no lease, no process.
WAITING: frozenset[str] = frozenset({S.AWAITING_APPROVAL, S.AWAITING_INPUT})
# States in which a step is due (a worker should be advancing the run).
STEPPABLE: frozenset[str] = ACTIVE - WAITING

_FORWARD: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.PREPARING}),
    S.PREPARING: frozenset({S.CONTEXT_LOADING}),
    S.CONTEXT_LOADING: frozenset({S.PLANNING}),
    # A plan under review, or a question the model asked, waits for a person.
    S.PLANNING: frozenset({S.RUNNING, S.AWAITING_INPUT}),
    S.RUNNING: frozenset({S.VERIFYING, S.AWAITING_INPUT}),
    S.AWAITING_INPUT: frozenset({S.RUNNING}),
    # Verification failure goes back to running with feedback, inside the budget.
    S.VERIFYING: frozenset({S.JUDGING, S.RUNNING}),
    S.JUDGING: frozenset({S.AWAITING_APPROVAL, S.CREATING_PR, S.RUNNING}),
    S.AWAITING_APPROVAL: frozenset({S.CREATING_PR, S.FAILED}),
    S.CREATING_PR: frozenset({S.COMPLETED}),
}

# Any active state may end in cancelled, failed or timed_out.
TRANSITIONS: dict[str, frozenset[str]] = {
    status: _FORWARD.get(status, frozenset()) | {S.CANCELLED, S.FAILED, S.TIMED_OUT}
    for status in ACTIVE
}
for _terminal in TERMINAL:
    TRANSITIONS[_terminal] = frozenset()


class IllegalTransition(Exception):
    """The state machine does not allow this change; nothing was changed."""

    def __init__(self, source: str, target: str) -> None:
        super().__init__(f"illegal run transition {source} -> {target}")
        self.source = source
        self.target = target


def transition_check(source: str, target: str) -> None:
    """Raise IllegalTransition unless ``source -> target`` is declared above."""
    if target not in TRANSITIONS.get(source, frozenset()):
        raise IllegalTransition(source, target)


def is_allowed(source: str, target: str) -> bool:
    return target in TRANSITIONS.get(source, frozenset())
