"""The model asks a person: the run waits with no worker and no lease, survives the death
of the worker that asked, and resumes on the API's answer without asking the model again
for the turns it already took. A question is answered once; an ended run takes none."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.engine import run_drive_inline
from runs.models import InputRequest, Membership, ModelTurn, Run
from runs.services import run_cancel_request, task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for
from tests.factories import UserFactory
from tests.runs.asking_model import QUESTION, asked, drive, local_model, respond, tool_result
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

pytestmark = [pytest.mark.django_db(transaction=True)]

MODEL = {"provider": "openai:local-model"}


def _answerer(workspace, role="approver"):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=role)
    api = APIClient()
    api.force_authenticate(user)
    return api, user


def _answer(api, run, question_id, answer):
    return api.post(
        f"/api/runs/{run.pk}/input/",
        {"question_id": str(question_id), "answer": answer},
        format="json",
    )


@pytest.mark.slow
def test_a_waiting_run_holds_no_lease_outlives_its_worker_and_resumes_on_the_api_answer(
    workspace, repository, start_worker, monkeypatch
):
    with ChatCompletionsServer(respond) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        asker = start_worker("asker")
        run = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=MODEL
        ).run
        wait_for(
            lambda: Run.objects.filter(pk=run.pk, status="awaiting_input").exists(),
            timeout=90,
            message="the run to wait for an answer",
        )
        run.refresh_from_db()
        assert (run.lease_owner, run.lease_until) == ("", None)
        assert run.task.status == "awaiting_input"
        question = InputRequest.objects.get(run=run)
        assert (question.status, question.question) == ("pending", QUESTION)
        assert question.choices == ["calc/core.py", "calc/util.py"]
        requested = run.events.get(type="agent.run.input.requested")
        assert requested.data["question_id"] == str(question.pk)
        assert asked(server.requests) == {"plan": 1, "act-0": 1}

        asker.kill()  # nothing is lost: the run is rows, not a process
        start_worker("answerer")
        api, user = _answerer(workspace)
        response = _answer(api, run, question.pk, "calc/core.py, keep util untouched")
        assert response.status_code == 202, response.content

        def ended():
            run.refresh_from_db()
            return run.status in TERMINAL

        wait_for(ended, timeout=120, message="the run to end")
        assert run.status == "completed", (run.failure_reason, run.failure_detail)
        # Every turn taken before the wait was asked once; the answer was the ask's result.
        assert asked(server.requests) == {"plan": 1, "act-0": 1, "act-1": 1, "act-2": 1}
        assert ModelTurn.objects.filter(run=run).count() == 4
        answered = tool_result(server.requests[2], "call_ask")
        assert "calc/core.py, keep util untouched" in answered
        assert user.get_username() in answered
        received = run.events.get(type="agent.run.input.received")
        assert received.data["via"] == "api" and received.data["by"] == user.get_username()
        statuses = [e.data["to"] for e in run.events.filter(type="agent.run.status.changed")]
        assert statuses.count("awaiting_input") == 1

        again = _answer(api, run, question.pk, "calc/util.py")
        assert again.status_code == 409
        assert again.json()["code"] == "input_already_answered"
        assert InputRequest.objects.get(pk=question.pk).answer.startswith("calc/core.py")


def test_a_second_answer_is_refused_and_the_first_one_stands(workspace, repository, settings):
    with ChatCompletionsServer(respond) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=MODEL
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        question = InputRequest.objects.get(run=run)
        api, _user = _answerer(workspace)
        outsider, _ = _answerer(workspace, role="member")
        refused = _answer(outsider, run, question.pk, "calc/util.py")
        assert refused.status_code == 403 and refused.json()["code"] == "answer_not_allowed"
        assert _answer(api, run, question.pk, "calc/core.py").status_code == 202
        second = _answer(api, run, question.pk, "calc/util.py")
        assert second.status_code == 409, second.content
        assert second.json()["code"] == "input_already_answered"
        assert second["content-type"].startswith("application/problem+json")
        assert run.events.filter(type="agent.run.input.received").count() == 1
        assert drive(run).status == "completed"
        assert "calc/core.py" in tool_result(server.requests[2], "call_ask")


def test_an_answer_to_a_cancelled_run_is_refused_with_a_clear_error(
    workspace, repository, settings
):
    with ChatCompletionsServer(respond) as server:
        local_model(settings, server)
        run = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=MODEL
        ).run
        assert run_drive_inline(run_id=run.pk).status == "awaiting_input"
        question = InputRequest.objects.get(run=run)
        assert run_cancel_request(run=run, by="ops", reason="not today")
        # The cancelled run's wake-up: a step ends it (no worker in this test).
        assert drive(run).status == "cancelled"
        api, _user = _answerer(workspace)
        response = _answer(api, run, question.pk, "calc/core.py")
        assert response.status_code == 409
        assert response.json()["code"] == "run_ended"
        assert "cancelled" in response.json()["detail"]
        assert len(server.requests) == 2
