"""Waiting costs nothing: a long wait for an answer does not count against the wall-clock
budget, and a question nobody answers ends the run timed_out, by the beat safety net."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from jobs.schedules import schedules_registered
from runs.agent.budget import budget_used
from runs.engine import run_drive_inline
from runs.models import InputRequest, Membership, Run
from runs.services import CommandRefused, task_submit
from runs.waiting import input_answer, inputs_expire
from tests.factories import UserFactory
from tests.runs.asking_model import QUESTION, drive, local_model, respond
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

pytestmark = [pytest.mark.django_db(transaction=True)]

MODEL = {"provider": "openai:local-model"}


def _approver(workspace):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="approver")
    return user


def test_a_question_unanswered_past_its_expiry_ends_the_run_timed_out(
    workspace, repository, settings
):
    settings.INPUT_TTL_SECONDS = 3600
    with ChatCompletionsServer(respond) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=MODEL
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        question = InputRequest.objects.get(run=run)
        assert question.expires_at - question.requested_at == timedelta(seconds=3600)
        assert inputs_expire(now=timezone.now() + timedelta(seconds=1800)) == 0
        assert inputs_expire(now=timezone.now() + timedelta(seconds=3601)) == 1
        assert inputs_expire(now=timezone.now() + timedelta(seconds=3601)) == 0
        ended = drive(run)
    assert ended.status == "timed_out"
    assert ended.failure_reason == "input_expired"
    assert QUESTION in ended.failure_detail
    assert InputRequest.objects.get(pk=question.pk).status == "expired"
    types = list(ended.events.values_list("type", flat=True))
    assert "agent.run.input.expired" in types and "agent.run.timed_out" in types
    with pytest.raises(CommandRefused) as refused:
        input_answer(
            run=ended,
            question_id=question.pk,
            answer="too late",
            by="rita",
            user=_approver(workspace),
            via="api",
        )
    assert refused.value.code == "run_ended"


def test_the_beat_runs_the_expiry_sweep():
    assert ("runs.inputs_expire", 30) in {(s.task, s.every_seconds) for s in schedules_registered()}


def test_a_long_wait_for_an_answer_leaves_the_wall_clock_budget_alone(
    workspace, repository, settings
):
    settings.INPUT_TTL_SECONDS = 7 * 24 * 3600
    with ChatCompletionsServer(respond) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options=MODEL,
            budget={"wall_clock_seconds": 600},
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        question = InputRequest.objects.get(run=run)
        # Three days later, someone answers; the run goes on as if no time had passed.
        with time_machine.travel(timezone.now() + timedelta(days=3), tick=True):
            input_answer(
                run=run,
                question_id=question.pk,
                answer="calc/core.py",
                by="rita",
                user=_approver(workspace),
                via="api",
            )
            ended = drive(run)
            used = budget_used(task=ended.task, run=ended, name="wall_clock_seconds")
    assert ended.status == "completed", (ended.failure_reason, ended.failure_detail)
    assert used < 600
    assert not ended.events.filter(type="agent.budget.exhausted").exists()
    assert Run.objects.get(pk=run.pk).task.usage.get("wall_clock_seconds", 0) < 600
