"""A run on a real worker process: its counters reach /metrics of this process, its log
lines carry the run id and the trace begun at submission, a dead letter is counted, and no
secret of the run's settings shows up in any log line, event or artifact."""

from __future__ import annotations

import json

import pytest

from jobs import tracing
from jobs.consumers import Consumer, Event, PermanentConsumerError
from jobs.models import DeadLetter, OutboxEvent
from runs import demo
from runs.models import Artifact, ModelTurn, Run, RunEvent, ToolCall
from runs.services import task_submit
from runs.state import TERMINAL
from tests.agentplatform.test_metrics_endpoint import scrape, total, value
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = INCOMING.split("-")[1]
SECRETS = {
    "GITHUB_TOKEN": "ghp_" + "Q" * 36,
    "OPENAI_API_KEY": "sk-obsv-" + "k" * 32,
    "GITHUB_WEBHOOK_SECRET": "global-webhook-secret-4711",
}
REPOSITORY_SECRET = "repository-webhook-secret-0815"
MODEL_KEY = "model-option-key-2342-abcdef"


def refuse(event: Event) -> None:
    raise PermanentConsumerError(f"refusing {event.type}")


REFUSER = Consumer(name="refuser", types=("agent.run.completed",), handle=refuse)


def test_worker_run_moves_counters_carries_trace_and_leaks_no_secret(
    workspace, repository, start_worker, monkeypatch, client
):
    for name, secret in SECRETS.items():
        monkeypatch.setenv(name, secret)
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv(
        "EVENT_CONSUMERS",
        "runs.cost_aggregation.COST_AGGREGATION,tests.integration.test_observability_worker.REFUSER",
    )
    repository.webhook_secret = REPOSITORY_SECRET
    repository.save()
    before = scrape(client)
    worker = start_worker("obsv")

    with tracing.trace_scope(INCOMING):
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={
                "provider": "scripted",
                "script": demo.fix_script(),
                "api_key": MODEL_KEY,
            },
        )

    def ended() -> Run | None:
        run = Run.objects.get(pk=submission.run.pk)
        return run if run.status in TERMINAL else None

    run = wait_for(ended, timeout=90, message="run to end")
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    wait_for(
        lambda: DeadLetter.objects.filter(task_name="event.consume").exists(),
        timeout=30,
        message="the refused event to be dead-lettered",
    )
    after = scrape(client)

    # Steps ran only in the worker; this process sums the worker's files.
    assert (
        value(after, "agent_runs_completed_total", outcome="completed")
        - value(before, "agent_runs_completed_total", outcome="completed")
        == 1
    )
    assert (
        total(after, "agent_step_duration_seconds_count")
        - total(before, "agent_step_duration_seconds_count")
        >= 8
    )
    assert total(after, "agent_tool_calls_total") > total(before, "agent_tool_calls_total")
    # The worker counts and times each Celery task it ran, by task name.
    steps = {"task": "runs.step", "outcome": "succeeded"}
    assert value(after, "agent_celery_tasks_total", **steps) > value(
        before, "agent_celery_tasks_total", **steps
    )
    assert value(after, "agent_celery_task_seconds_count", task="runs.step") > value(
        before, "agent_celery_task_seconds_count", task="runs.step"
    )
    assert (
        value(after, "agent_dead_letters_total", task="event.consume")
        - value(before, "agent_dead_letters_total", task="event.consume")
        == 1
    )
    assert value(after, "agent_dead_letters_open") >= 1
    assert total(after, "agent_consumer_events_total") > total(
        before, "agent_consumer_events_total"
    )

    worker.stop()
    output = worker.output()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    steps = [line for line in lines if line["event"] == "step.committed"]
    assert len(steps) >= 6
    for line in steps:
        assert line["run_id"] == str(run.id)
        assert line["trace_id"] == TRACE_ID
        assert line["celery_task"] == "runs.step"
    consumed = [line for line in lines if line.get("work_kind") == "event.consume"]
    assert consumed and {line["trace_id"] for line in consumed} == {TRACE_ID}
    payloads = OutboxEvent.objects.filter(payload__taskid=str(submission.task.id))
    assert {tracing.trace_id_of(p.payload["traceparent"]) for p in payloads} == {TRACE_ID}

    secrets = [*SECRETS.values(), REPOSITORY_SECRET, MODEL_KEY]
    stored = json.dumps(
        [
            list(RunEvent.objects.filter(run=run).values_list("data", flat=True)),
            [p.payload for p in payloads],
            list(Artifact.objects.filter(run=run).values_list("content", flat=True)),
            list(ModelTurn.objects.filter(run=run).values_list("response", flat=True)),
            list(ToolCall.objects.filter(run=run).values_list("arguments", "result")),
            list(DeadLetter.objects.values_list("exception", "traceback", "kwargs", "args")),
        ],
        default=str,
    )
    assert "Connected to redis" in output  # the log is the worker's whole output
    for secret in secrets:
        assert secret not in output, f"secret in the worker log: {secret[:6]}..."
        assert secret not in stored, f"secret stored in an event or artifact: {secret[:6]}..."
