"""The run state machine: declared once, enforced in one place, refusals change nothing."""

from __future__ import annotations

import pytest

from runs.engine import step_commit
from runs.lease import Lease, lease_acquire
from runs.models import Run
from runs.protocol import Outcome, StepContext
from runs.state import ACTIVE, TERMINAL, TRANSITIONS, IllegalTransition, transition_check
from tests.factories import TaskFactory

S = Run.Status

DESIGN_EDGES = [
    ("queued", "preparing"),
    ("preparing", "context_loading"),
    ("context_loading", "planning"),
    ("planning", "running"),
    ("running", "verifying"),
    ("verifying", "judging"),
    ("verifying", "running"),
    ("judging", "awaiting_approval"),
    ("judging", "creating_pr"),
    ("judging", "running"),
    ("awaiting_approval", "creating_pr"),
    ("awaiting_approval", "failed"),
    ("creating_pr", "completed"),
    # A person in the loop (docs/design.md §4): a question the model asked, or its plan.
    ("planning", "awaiting_input"),
    ("running", "awaiting_input"),
    ("awaiting_input", "running"),
]


@pytest.mark.no_services
@pytest.mark.parametrize(("source", "target"), DESIGN_EDGES)
def test_every_designed_transition_is_allowed(source, target):
    transition_check(source, target)


@pytest.mark.no_services
@pytest.mark.parametrize("source", sorted(ACTIVE))
@pytest.mark.parametrize("target", ["cancelled", "failed", "timed_out"])
def test_any_active_state_can_end(source, target):
    transition_check(source, target)


@pytest.mark.no_services
def test_nothing_else_is_allowed():
    allowed = set(DESIGN_EDGES) | {
        (s, t) for s in ACTIVE for t in ("cancelled", "failed", "timed_out")
    }
    for source in S.values:
        for target in S.values:
            if (source, target) in allowed:
                continue
            with pytest.raises(IllegalTransition):
                transition_check(source, target)


@pytest.mark.no_services
def test_terminal_states_have_no_way_out():
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()


@pytest.mark.django_db
def test_an_illegal_transition_raises_and_changes_nothing():
    task = TaskFactory()
    run = Run.objects.create(task=task, run_no=1)
    lease = lease_acquire(run_id=run.id, step_no=0, owner="test-owner")
    assert lease is not None
    run.refresh_from_db()
    before = (run.status, run.step_no, run.events.count())

    with pytest.raises(IllegalTransition):
        step_commit(StepContext(run, lease), Outcome(to=S.CREATING_PR))

    run.refresh_from_db()
    assert (run.status, run.step_no, run.events.count()) == before


@pytest.mark.django_db
def test_a_legal_transition_records_the_change_on_the_timeline(django_capture_on_commit_callbacks):
    task = TaskFactory()
    run = Run.objects.create(task=task, run_no=1)
    lease = lease_acquire(run_id=run.id, step_no=0, owner="test-owner")
    assert isinstance(lease, Lease)

    with django_capture_on_commit_callbacks() as callbacks:
        step_commit(StepContext(run, lease), Outcome(to=S.PREPARING))

    run.refresh_from_db()
    assert run.status == S.PREPARING
    assert run.step_no == 1
    assert run.lease_owner == ""
    change = run.events.get(type="agent.run.status.changed")
    assert change.data == {"from": "queued", "to": "preparing", "reason": ""}
    assert callbacks, "the next step is dispatched on commit"
