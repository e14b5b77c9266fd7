"""/metrics: access rules, text format, and counters that move when things happen."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run
from runs.services import task_submit
from tests.test_webhook_support import GITHUB_SECRET, github_post

pytestmark = pytest.mark.django_db(transaction=True)

STATE_GAUGES = {
    "agent_outbox_lag_seconds",
    "agent_outbox_pending",
    "agent_queue_depth",
    "agent_dead_letters_open",
    "agent_oldest_lease_age_seconds",
    "agent_runs_active",
}


def scrape(client, **extra) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_loopback_scrape_parses_and_has_every_state_gauge(client):
    samples = scrape(client)
    names = {name for name, _ in samples}
    assert names >= STATE_GAUGES
    assert value(samples, "agent_runs_active", status="queued") == 0


def test_other_networks_are_refused_without_a_token(client):
    response = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["status"] == 403


def test_loopback_through_a_proxy_is_not_trusted(client):
    response = client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert response.status_code == 403


def test_token_opens_metrics_to_any_network(client, settings):
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    outside = {"REMOTE_ADDR": "203.0.113.9"}
    refused = client.get("/metrics", **outside)
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **outside)
    assert wrong.status_code == 401
    scrape(client, HTTP_AUTHORIZATION="Bearer scrape-token-0123456789", **outside)


def test_allowlisted_network_needs_no_token(client, settings):
    settings.METRICS_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    scrape(client, REMOTE_ADDR="203.0.113.9")
    assert client.get("/metrics").status_code == 403  # loopback is no longer listed


def test_only_get(client):
    assert client.post("/metrics").status_code == 405


def test_a_run_moves_task_run_step_and_tool_counters(client, workspace, repository):
    before = scrape(client)
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert (
        moved("agent_tasks_submitted_total", task_type="change", risk_level="low", source="api")
        == 1
    )
    assert moved("agent_runs_started_total", model_profile="scripted") == 1
    assert moved("agent_runs_completed_total", outcome="completed") == 1
    assert moved("agent_run_duration_seconds_count") == 1
    assert moved("agent_step_duration_seconds_count", step="running") >= 1
    assert moved("agent_step_duration_seconds_count", step="verifying") >= 1
    tool_calls = total(after, "agent_tool_calls_total") - total(before, "agent_tool_calls_total")
    assert tool_calls >= 1
    assert moved("agent_prs_created_total", provider=repository.provider) == 1
    tokens = total(after, "agent_model_tokens_total") - total(before, "agent_model_tokens_total")
    assert tokens > 0
    assert moved("agent_cost_usd_total", workspace=str(workspace.pk)) > 0
    assert total(after, "agent_judge_verdicts_total") > total(before, "agent_judge_verdicts_total")
    assert value(after, "agent_runs_active", status="running") == 0


def test_webhook_deliveries_are_counted_by_result(client, settings):
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    before = scrape(client)
    accepted = github_post(client, {"zen": "hi", "hook_id": 1}, "ping")
    assert accepted.status_code == 202
    refused = client.post(
        "/webhooks/github/",
        data=json.dumps({"zen": "x"}),
        content_type="application/json",
        headers={"X-GitHub-Event": "ping", "X-GitHub-Delivery": "d-1"},
    )
    assert refused.status_code in (401, 403)
    after = scrape(client)
    key = ("agent_webhook_deliveries_total", (("provider", "github"), ("result", "accepted")))
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert (
        total(after, "agent_webhook_signature_failures_total")
        - total(before, "agent_webhook_signature_failures_total")
        == 1
    )


def test_deferred_submissions_are_counted_by_kind_of_reason(client, workspace, repository):
    workspace.max_active_runs = 1
    workspace.save()
    before = scrape(client)
    first = task_submit(workspace=workspace, repository=repository, instruction="one")
    second = task_submit(workspace=workspace, repository=repository, instruction="two")
    assert first.run is not None and second.run is None
    after = scrape(client)
    reason = "workspace at its limit of N active runs"
    assert (
        value(after, "agent_tasks_deferred_total", reason=reason)
        - value(before, "agent_tasks_deferred_total", reason=reason)
        == 1
    )
    assert value(after, "agent_runs_active", status="queued") >= 1
