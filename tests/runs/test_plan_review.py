"""Plan review: the run pauses after planning until a person accepts, edits or rejects
the plan; an edited plan is what the agent follows, a rejected one ends the run."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.engine import run_drive_inline
from runs.models import InputRequest, Membership, Task
from runs.services import task_submit
from tests.factories import UserFactory
from tests.runs.asking_model import PLAN, asked, drive, local_model, respond_without_asking
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

pytestmark = [pytest.mark.django_db(transaction=True)]

MODEL = {"provider": "openai:local-model"}
EDITED = "1. Change only calc/core.py: add() must return a + b. 2. Run the tests. 3. Finish."


def _reviewer(workspace):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="approver")
    api = APIClient()
    api.force_authenticate(user)
    return api


def _decide(api, run, question, decision, answer=""):
    return api.post(
        f"/api/runs/{run.pk}/input/",
        {"question_id": str(question.pk), "decision": decision, "answer": answer},
        format="json",
    )


def test_an_edited_plan_replaces_the_models_and_is_what_the_agent_is_sent(
    workspace, repository, settings
):
    repository.plan_review = True
    repository.save(update_fields=["plan_review"])
    with ChatCompletionsServer(respond_without_asking) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=MODEL
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        review = InputRequest.objects.get(run=run)
        assert (review.kind, review.question) == ("plan", PLAN)
        assert asked(server.requests) == {"plan": 1}
        requested = run.events.get(type="agent.run.input.requested")
        assert requested.data["kind"] == "plan"

        response = _decide(_reviewer(workspace), run, review, "edit", EDITED)
        assert response.status_code == 202, response.content
        assert drive(run).status == "completed"

    assert asked(server.requests) == {"plan": 1, "act-0": 1, "act-1": 1}
    first_act = server.requests[1]["messages"]
    plans = [m["content"] for m in first_act if m["role"] == "assistant"]
    assert plans == [f"Plan:\n{EDITED}"], plans
    assert PLAN not in str(first_act)
    edited = run.events.filter(type="agent.plan.created").order_by("sequence_no").last()
    assert edited.data["summary"] == EDITED[:300] and edited.data["edited_by"]
    assert run.artifacts.filter(kind="plan", name="plan (edited)", content=EDITED).exists()


def test_an_accepted_plan_goes_on_unchanged(workspace, repository, settings):
    with ChatCompletionsServer(respond_without_asking) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options=MODEL,
            plan_review=True,
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        review = InputRequest.objects.get(run=run)
        assert _decide(_reviewer(workspace), run, review, "accept").status_code == 202
        assert drive(run).status == "completed"
    plans = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "assistant"]
    assert plans == [f"Plan:\n{PLAN}"]


def test_a_rejected_plan_ends_the_run_with_its_reason(workspace, repository, settings):
    with ChatCompletionsServer(respond_without_asking) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options=MODEL,
            plan_review=True,
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        review = InputRequest.objects.get(run=run)
        response = _decide(_reviewer(workspace), run, review, "reject", "wrong module")
        assert response.status_code == 202
        ended = drive(run)
    assert ended.status == "failed"
    assert ended.failure_reason == "plan_rejected"
    assert "wrong module" in ended.failure_detail
    assert asked(server.requests) == {"plan": 1}
    assert Task.objects.get(pk=run.task_id).status == "failed"


def test_the_api_takes_plan_review_per_task_and_per_repository(submitter):
    api, repository = submitter
    response = api.post(
        "/api/tasks/",
        {"repository": repository.pk, "instruction": "Fix add()", "plan_review": True},
        format="json",
    )
    assert response.status_code == 202, response.content
    task = Task.objects.get(pk=response.json()["task_id"])
    assert task.plan_review is True
    assert api.get(f"/api/tasks/{task.pk}/").json()["plan_review"] is True
    assert api.get(f"/api/repositories/{repository.pk}/").json()["plan_review"] is False
