"""Event contracts: what producers emit validates against docs/events, parses as a
CloudEvent, matches the golden fixtures, and consumers ignore unknown fields."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import jsonschema
import pytest
import redis
import yaml
from cloudevents.core.formats.json import JSONFormat
from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from jobs.consumers import Event, event_consume
from jobs.contracts import catalog
from jobs.dead_letters import dead_letter_record
from jobs.models import OutboxEvent, WorkspaceDailyCost
from runs import demo, engine
from runs.engine import run_drive_inline
from runs.models import Run, Task
from runs.services import run_approve, run_cancel_request, task_submit
from runs.state import TERMINAL
from runs.waiting import input_answer, inputs_expire
from tests.conftest import ROOT
from tests.factories import TaskFactory, UserFactory
from tests.runs.asking_model import drive as asking_drive
from tests.runs.asking_model import local_model
from tests.runs.asking_model import respond as asking_respond
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

GOLDEN = ROOT / "tests" / "golden" / "events"
FORMAT = jsonschema.Draft202012Validator.FORMAT_CHECKER


def _schema(event_type: str) -> dict:
    path = ROOT / "docs" / "events" / event_type / "v1.json"
    assert path.exists(), f"no schema for {event_type}"
    return json.loads(path.read_text())


def _assert_contract(payload: dict) -> None:
    jsonschema.validate(payload, _schema(payload["type"]), format_checker=FORMAT)
    event = JSONFormat().read(None, json.dumps(payload))
    assert event.get_id() == payload["id"]
    assert event.get_type() == payload["type"]
    assert event.get_extension("eventversion") == "1"


def _drive(run: Run) -> Run:
    """Step the run in this process until it ends or waits for a human."""
    for _ in range(100):
        run.refresh_from_db()
        if run.status in TERMINAL or run.status == Run.Status.AWAITING_APPROVAL:
            return run
        engine.step_execute(run_id=str(run.id), step_no=run.step_no)
    raise AssertionError(f"run stuck in {run.status}")


@pytest.fixture
def no_wakeups():
    # The runs are stepped here; drop the wake-up messages nobody will consume.
    yield
    redis.Redis.from_url(settings.REDIS_URL).delete("agent", "verify", "events")


def test_the_documents_match_the_catalog():
    call_command("event_catalog", "--check")
    document = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())
    assert document["asyncapi"].startswith("3.")
    assert document["channels"]["events"]["address"] == "agent.events.v1"
    names = {m["name"] for m in document["components"]["messages"].values()}
    assert {entry.type for entry in catalog()} <= names
    for entry in catalog():
        jsonschema.Draft202012Validator.check_schema(_schema(entry.type))


@pytest.mark.django_db(transaction=True)
def test_every_event_the_platform_produces_matches_its_contract(
    workspace,
    repository,
    no_wakeups,
):
    options = {"provider": "scripted", "script": demo.fix_script()}
    done = task_submit(
        workspace=workspace, repository=repository, instruction="Fix add()", model_options=options
    )
    assert _drive(done.run).status == Run.Status.COMPLETED
    supervised = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add() carefully",
        model_options=options,
        execution_mode=Task.Mode.SUPERVISED_PR,
    )
    waiting = _drive(supervised.run)
    if waiting.status == Run.Status.AWAITING_APPROVAL:
        run_approve(
            run=waiting,
            by="reviewer",
            user=UserFactory(username="reviewer", is_superuser=True),
        )
        _drive(waiting)
    dry = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Try add()",
        model_options=options,
        execution_mode=Task.Mode.DRY_RUN,
    )
    _drive(dry.run)
    cancelled = task_submit(
        workspace=workspace, repository=repository, instruction="Stop", model_options=options
    )
    run_cancel_request(run=cancelled.run, by="operator", reason="changed my mind")
    _drive(cancelled.run)
    workspace.max_active_runs = 0
    workspace.save()
    task_submit(
        workspace=workspace, repository=repository, instruction="Later", model_options=options
    )
    dead_letter_record(
        task_name="jobs.event_consume",
        task_id="t-1",
        args=["cost_aggregation", str(OutboxEvent.objects.first().event_id)],
        kwargs={},
        queue="events",
        exception="RuntimeError: boom",
        traceback="Traceback ...",
        attempts=3,
    )

    payloads = list(OutboxEvent.objects.order_by("id").values_list("payload", flat=True))
    for payload in payloads:
        _assert_contract(payload)
    produced = {p["type"] for p in payloads}
    assert {
        "agent.task.submitted",
        "agent.run.status.changed",
        "agent.model.turn.completed",
        "agent.tool.call.completed",
        "agent.patch.created",
        "agent.verification.passed",
        "agent.judge.completed",
        "agent.pr.created",
        "agent.pr.skipped",
        "agent.run.cancelled",
        "agent.task.deferred",
        "agent.job.dead_lettered",
        "agent.task.completed",
    } <= produced
    unknown = produced - {entry.type for entry in catalog()}
    assert not unknown, f"types without a catalog entry: {unknown}"


@pytest.mark.django_db(transaction=True)
def test_the_person_in_the_loop_events_match_their_contracts(
    workspace, repository, settings, no_wakeups
):
    model = {"provider": "openai:local-model"}
    with ChatCompletionsServer(asking_respond) as server:
        local_model(settings, server)
        answered = task_submit(
            workspace=workspace, repository=repository, instruction="Fix add()", model_options=model
        ).run
        assert run_drive_inline(run_id=answered.pk).status == Run.Status.AWAITING_INPUT
        input_answer(
            run=answered,
            question_id=answered.input_requests.get().pk,
            answer="calc/core.py",
            by="reviewer",
            user=UserFactory(username="reviewer", is_superuser=True),
            via="api",
        )
        assert asking_drive(answered).status == Run.Status.COMPLETED
        expiring = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add() again",
            model_options=model,
            plan_review=True,
        ).run
        assert run_drive_inline(run_id=expiring.pk).status == Run.Status.AWAITING_INPUT
        assert inputs_expire(now=timezone.now() + timedelta(seconds=settings.INPUT_TTL_SECONDS + 1))
        assert asking_drive(expiring).status == Run.Status.TIMED_OUT
    payloads = list(OutboxEvent.objects.order_by("id").values_list("payload", flat=True))
    for payload in payloads:
        _assert_contract(payload)
    produced = [p["type"] for p in payloads]
    assert produced.count("agent.run.input.requested") == 2
    assert produced.count("agent.run.input.received") == 1
    assert produced.count("agent.run.input.expired") == 1


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden_events_match_their_contract(path: Path):
    _assert_contract(json.loads(path.read_text()))


@pytest.mark.django_db(transaction=True)
def test_consumers_ignore_unknown_fields(workspace):
    golden = json.loads((GOLDEN / "agent.model.turn.completed.json").read_text())
    task = TaskFactory(workspace=workspace)
    payload = copy.deepcopy(golden)
    payload.update(
        workspaceid=str(workspace.pk), taskid=str(task.id), futureextension="x", partitionhint=3
    )
    payload["data"].update(cache_hits=9, reasoning={"tokens": 12}, provider_meta=["a"])
    with transaction.atomic():
        OutboxEvent.objects.create(
            event_id=payload["id"],
            type=payload["type"],
            partition_key=payload["runid"],
            payload=payload,
        )
    _assert_contract(payload)
    assert Event.from_envelope(payload).data["tokens_in"] == 1200

    assert event_consume(consumer="cost_aggregation", event_id=payload["id"]) == "processed"
    cost = WorkspaceDailyCost.objects.get(workspace_id=workspace.pk)
    assert (cost.cost_usd, cost.tokens_in) == (Decimal("0.004250"), 1200)
