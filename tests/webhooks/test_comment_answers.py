"""Against real workers: a run of an issue's task asks a question, the question is posted
on the issue (a local GitHub), and a signed ``/agent answer`` comment from a linked
approver resumes the run. The same comment delivered twice is applied once; a second
answer is refused on the thread."""

from __future__ import annotations

import copy
import uuid

import pytest

from runs.models import InputRequest, Membership, ProviderIdentity, Run, Task
from runs.services import task_submit
from runs.state import TERMINAL
from tests.chaos.fakegithub import FakeGitHub
from tests.conftest import wait_for
from tests.factories import UserFactory
from tests.runs.asking_model import QUESTION, asked, respond, tool_result
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer
from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
from webhooks.models import WebhookReceipt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _comment(payload, body, comment_id):
    sent = copy.deepcopy(payload)
    sent["comment"]["body"] = body
    sent["comment"]["id"] = comment_id
    return sent


def _bodies(github, number=3):
    with github.lock:
        return [c["body"] for c in github.comments.get(("octo/e2e", number), [])]


def test_a_signed_comment_answers_the_question_once_and_the_run_resumes(
    client, repository, start_worker, monkeypatch
):
    github = FakeGitHub()
    try:
        with ChatCompletionsServer(respond) as model:
            monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
            repository.external_id = "octo/e2e"
            repository.webhook_secret = REPOSITORY_SECRET
            repository.save(update_fields=["external_id", "webhook_secret"])
            rita = UserFactory(username="rita")
            Membership.objects.create(workspace=repository.workspace, user=rita, role="approver")
            payload = corpus("github", "issue_comment/created")
            payload["repository"]["full_name"] = "octo/e2e"
            payload["issue"]["number"] = 3
            payload["comment"]["author_association"] = "OWNER"
            ProviderIdentity.objects.create(
                workspace=repository.workspace,
                user=rita,
                provider="github",
                host="127.0.0.1",
                external_user_id=str(payload["comment"]["user"]["id"]),
                login="Codertocat",
            )
            start_worker(env={"GITHUB_API_URL": github.url, "GITHUB_TOKEN": "ghp_" + "r" * 36})
            run = task_submit(
                workspace=repository.workspace,
                repository=repository,
                instruction="Fix add()",
                model_options={"provider": "openai:local-model"},
                source_ref={"provider": "github", "repo": "octo/e2e", "issue_number": 3},
                source=Task.Source.WEBHOOK,
                idempotency_key="github:issue:octo/e2e#3",
            ).run
            wait_for(
                lambda: Run.objects.filter(pk=run.pk, status="awaiting_input").exists(),
                timeout=90,
                message="the run to wait for an answer",
            )
            # The question is asked where the task came from.
            asking = wait_for(
                lambda: [b for b in _bodies(github) if QUESTION in b],
                timeout=60,
                message="the question posted on the issue",
            )
            assert len(asking) == 1 and "/agent answer" in asking[0]

            answer = _comment(payload, "/agent answer calc/core.py, please", 424242)
            delivery = str(uuid.uuid4())
            for delivery_id in (delivery, delivery, str(uuid.uuid4())):
                sent = github_post(
                    client, answer, "issue_comment", secret=REPOSITORY_SECRET, delivery=delivery_id
                )
                assert sent.status_code in (200, 202), sent.content

            def ended():
                current = Run.objects.get(pk=run.pk)
                return current if current.status in TERMINAL else None

            finished = wait_for(ended, timeout=120, message="the run to end")
            assert finished.status == "completed", (
                finished.failure_reason,
                finished.failure_detail,
            )
            question = InputRequest.objects.get(run=run)
            assert (question.status, question.answered_by, question.answered_via) == (
                "answered",
                "rita",
                "comment",
            )
            assert question.answer == "calc/core.py, please"
            assert finished.events.filter(type="agent.run.input.received").count() == 1
            assert asked(model.requests) == {"plan": 1, "act-0": 1, "act-1": 1, "act-2": 1}
            assert "calc/core.py, please" in tool_result(model.requests[2], "call_ask")
            receipts = WebhookReceipt.objects.order_by("received_at")
            assert receipts.count() == 2  # the repeated delivery id was never stored again
            wait_for(
                lambda: all(r.status in ("processed", "ignored") for r in receipts.all()),
                timeout=30,
                message="both deliveries processed",
            )
            assert sorted(r.status for r in receipts.all()) == ["ignored", "processed"]

            # Another comment answering again is refused, and told so on the issue.
            late = _comment(payload, "/agent answer calc/util.py", 424243)
            assert (
                github_post(client, late, "issue_comment", secret=REPOSITORY_SECRET).status_code
                == 202
            )
            refusal = wait_for(
                lambda: [b for b in _bodies(github) if "input_already_answered" in b],
                timeout=60,
                message="the refusal posted on the issue",
            )
            assert "/agent answer" in refusal[0]
            assert InputRequest.objects.get(run=run).answer == "calc/core.py, please"
    finally:
        github.close()
