"""The step's fenced UPDATE writes the transition, the handler's fields and the
checkpoint, whether its SQL is written directly or compiled by the ORM."""

from __future__ import annotations

import pytest
from django.db.models import F

from runs.engine import step_commit
from runs.lease import lease_acquire_loaded
from runs.models import Run
from runs.protocol import Outcome, StepContext
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db
S = Run.Status


@pytest.fixture
def leased(repository):
    task = TaskFactory(workspace=repository.workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1, tokens_in=5)
    acquired = lease_acquire_loaded(run_id=run.id, step_no=0, owner="w")
    assert acquired is not None
    lease, loaded = acquired
    return StepContext(loaded, lease)


def test_fields_checkpoint_and_transition_are_written(leased):
    leased.checkpoint = {"turns": [1, 2], "note": "naïve ✓", "none": None}
    outcome = Outcome(
        to=S.PREPARING,
        fields={"base_commit": "a" * 40, "branch": "agent/x", "tokens_in": F("tokens_in") + 7},
    )
    assert step_commit(leased, outcome) == S.PREPARING
    run = Run.objects.get(pk=leased.run.pk)
    assert (run.status, run.step_no, run.lease_owner, run.lease_until) == (S.PREPARING, 1, "", None)
    assert (run.base_commit, run.branch, run.tokens_in) == ("a" * 40, "agent/x", 12)
    assert run.checkpoint == {"turns": [1, 2], "note": "naïve ✓", "none": None}
    assert run.started_at is not None and run.last_sequence_no == run.events.count()


def test_an_expression_over_another_field_is_compiled_by_the_orm(leased):
    outcome = Outcome(to=S.PREPARING, fields={"tokens_out": F("tokens_in") + 1})
    assert step_commit(leased, outcome) == S.PREPARING
    run = Run.objects.get(pk=leased.run.pk)
    assert (run.status, run.tokens_out) == (S.PREPARING, 6)


def test_a_lost_lease_writes_nothing(leased):
    Run.objects.filter(pk=leased.run.pk).update(attempt=F("attempt") + 1)
    outcome = Outcome(to=S.PREPARING, fields={"branch": "agent/x"})
    with pytest.raises(Exception, match="lost"):
        step_commit(leased, outcome)
    run = Run.objects.get(pk=leased.run.pk)
    assert (run.status, run.branch, run.step_no) == (S.QUEUED, "", 0)
