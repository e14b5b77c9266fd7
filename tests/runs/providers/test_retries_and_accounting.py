"""Honest accounting: a reply without choices is retried like a 5xx, every retry and
back-off is on the timeline (and valid against its contract), the model_errors budget
pays for exactly its limit of bad replies, and the scripted model costs nothing."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import ModelTurn, Run
from runs.providers.openai_chat import OpenAIChatProvider
from runs.services import task_submit
from runs.spend import workspace_spend_today
from tests.runs.providers.fakes import FIX_ACTS, ModelServer, Refusal, Turn, fix_script
from tests.runs.providers.timeline import assert_contracts

EMPTY_CHOICES = json.dumps(
    {"id": "chatcmpl-e", "object": "chat.completion", "model": "gpt-4o", "choices": []}
).encode()


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def _profile(settings, name: str, server: ModelServer, **extra) -> None:
    settings.MODEL_PROFILES = {
        **settings.MODEL_PROFILES,
        name: {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url, **extra},
    }


@pytest.mark.no_services
def test_an_empty_choices_list_is_asked_again():
    def script(seen, n):
        return EMPTY_CHOICES if n == 1 else Turn(text="done")

    with ModelServer("openai", script, model="gpt-4o") as server:
        provider = OpenAIChatProvider("gpt-4o", base_url=server.base_url, backoff_seconds=0.01)
        reply = provider.complete(
            messages=[{"role": "user", "content": "hi"}], tools=[], purpose="plan", turn_index=0
        )

    assert reply.content == "done"
    assert len(server.seen) == 2


@pytest.mark.django_db(transaction=True)
def test_every_retry_and_back_off_is_on_the_timeline(workspace, repository, settings):
    plays = fix_script(FIX_ACTS)

    def script(seen, n):
        if n == 1:
            return EMPTY_CHOICES
        if n == 2:
            return Refusal(429, {"error": {"message": "Rate limit reached"}}, {"retry-after": "0"})
        if n == 3:
            return Refusal(503, {"error": {"message": "The engine is currently overloaded"}})
        return plays(seen, n)

    with ModelServer("openai", script, model="gpt-4o") as server:
        _profile(settings, "bumpy", server)
        settings.OPENAI_RETRY_BACKOFF_SECONDS = 0.01
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "bumpy"},
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    retried = list(run.events.filter(type="agent.model.request.retried").order_by("sequence_no"))
    assert [(e.data["attempt"], e.data["status"]) for e in retried] == [
        (1, 200),
        (2, 429),
        (3, 503),
    ]
    assert "no choices" in retried[0].data["error"]
    assert retried[1].data["retry_after"] is True and retried[1].data["wait_seconds"] == 0
    assert "overloaded" in retried[2].data["error"]
    assert all(e.data["turn_no"] == 0 and e.data["purpose"] == "plan" for e in retried)
    # The retries come before the answer they led to.
    answered = run.events.filter(type="agent.model.turn.completed").order_by("sequence_no")[0]
    assert retried[-1].sequence_no < answered.sequence_no
    assert len(assert_contracts(run, "agent.model.request.retried")) == 3


@pytest.mark.django_db(transaction=True)
def test_a_step_given_up_on_leaves_its_failure_on_the_timeline(workspace, repository, settings):
    def script(seen, n):
        return Refusal(502, {"error": {"message": "upstream connect error"}})

    with ModelServer("openai", script, model="gpt-4o") as server:
        _profile(settings, "down", server)
        settings.OPENAI_RETRY_BACKOFF_SECONDS = 0.01
        settings.OPENAI_MAX_RETRIES = 1
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "down"},
        )
        with pytest.raises(Exception, match="still failing after 2 attempts"):
            run_drive_inline(run_id=submission.run.id)

    run = Run.objects.get(pk=submission.run.id)
    failed = run.events.get(type="agent.model.request.failed")
    assert failed.data["retryable"] is True and failed.data["status"] == 502
    assert "upstream connect error" in failed.data["error"] and failed.data["attempts"] == 2
    assert run.events.filter(type="agent.model.request.retried").count() == 1
    assert_contracts(run, "agent.model.request.failed")
    assert not ModelTurn.objects.filter(run=run).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", [1, 2])
def test_the_model_errors_budget_pays_for_exactly_its_limit(workspace, repository, settings, limit):
    def script(seen, n):
        return Turn(text="I am thinking about it.")

    with ModelServer("openai", script, model="gpt-4o") as server:
        _profile(settings, "chatty", server)
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "chatty"},
            budget={"model_errors": limit},
        )
        run = run_drive_inline(run_id=submission.run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "budget_model_errors")
    assert ModelTurn.objects.filter(run=run).exclude(problem="").count() == limit
    assert len(server.seen) == 1 + limit  # the plan, then exactly `limit` bad replies
    exhausted = run.events.get(type="agent.budget.exhausted")
    assert (exhausted.data["used"], exhausted.data["limit"]) == (limit, limit)


@pytest.mark.django_db(transaction=True)
def test_the_scripted_model_costs_nothing(workspace, repository):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    turns = ModelTurn.objects.filter(run=run)
    assert turns.count() >= 2 and all(t.tokens_in > 0 for t in turns)
    assert {t.cost_usd for t in turns} == {Decimal(0)}
    assert run.cost_usd == 0
    assert workspace_spend_today(workspace_id=workspace.pk) == 0
    costs = run.events.filter(type="agent.model.turn.completed").values_list(
        "data__cost_usd", flat=True
    )
    assert {Decimal(c) for c in costs} == {Decimal(0)}
