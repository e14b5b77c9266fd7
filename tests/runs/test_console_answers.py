"""The console: a run waiting for a person shows its question with a reply box; the
reply answers through the same service as the API; the runs waiting for people are one
link from the index, oldest first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runs.models import InputRequest, Run
from tests.factories import RunFactory, UserFactory

pytestmark = [pytest.mark.django_db]


def _waiting(status: str, waited: timedelta) -> Run:
    run = RunFactory()
    Run.objects.filter(pk=run.pk).update(
        status=status, status_changed_at=timezone.now() - waited, step_no=7
    )
    run.refresh_from_db()
    return run


def _question(run: Run, **fields) -> InputRequest:
    now = timezone.now()
    return InputRequest.objects.create(
        run=run,
        key="7:1:call_ask",
        question="Which module owns the fix?",
        choices=["calc/core.py", "calc/util.py"],
        call_id="call_ask",
        requested_at=now,
        expires_at=now + timedelta(days=7),
        **fields,
    )


def test_the_run_page_shows_the_question_and_its_reply_answers_it(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    run = _waiting("awaiting_input", timedelta(minutes=5))
    question = _question(run)
    page = client.get(reverse("admin:runs_run_change", args=[run.pk])).content.decode()
    assert 'id="input-question"' in page and "Which module owns the fix?" in page
    assert 'id="input-reply"' in page and f'value="{question.pk}"' in page
    assert "calc/util.py" in page

    operate = reverse("admin:runs_run_operate", args=[run.pk, "answer"])
    response = client.post(operate, {"question_id": str(question.pk), "answer": "core"})
    assert response.status_code == 302
    question.refresh_from_db()
    assert (question.status, question.answer, question.answered_via) == (
        "answered",
        "core",
        "console",
    )
    assert run.events.filter(type="agent.run.input.received").count() == 1
    # A second reply (a stale page) changes nothing.
    client.post(operate, {"question_id": str(question.pk), "answer": "util"})
    question.refresh_from_db()
    assert question.answer == "core"
    assert run.events.filter(type="agent.run.input.received").count() == 1


def test_runs_waiting_for_people_are_listed_oldest_first(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    newer = _waiting("awaiting_input", timedelta(minutes=5))
    oldest = _waiting("awaiting_approval", timedelta(hours=3))
    middle = _waiting("awaiting_input", timedelta(hours=1))
    RunFactory()  # queued: not waiting for a person
    index = client.get(reverse("admin:index")).content.decode()
    assert "?liveness=waiting" in index
    listing = client.get(reverse("admin:runs_run_changelist") + "?liveness=waiting")
    shown = [run.pk for run in listing.context["cl"].result_list]
    assert shown == [oldest.pk, middle.pk, newer.pk]
