"""/metrics as a dashboard reads it: every series of a known label set is there at 0 from
the first scrape, requests are counted and timed by route pattern, and spend is labelled
by workspace slug."""

from __future__ import annotations

import pytest

from agentplatform import metrics
from runs.models import Task
from tests.agentplatform.test_metrics_endpoint import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


def test_known_counters_are_present_at_zero_before_anything_happened(client, workspace):
    samples = scrape(client)
    present = {name for name, _ in samples}
    for name in (
        "agent_tasks_submitted_total",
        "agent_runs_completed_total",
        "agent_tool_calls_total",
        "agent_judge_verdicts_total",
        "agent_prs_created_total",
        "agent_webhook_deliveries_total",
        "agent_webhook_signature_failures_total",
        "agent_celery_tasks_total",
        "agent_cost_usd_total",
    ):
        assert name in present, f"{name} missing from the first scrape"
    key = (
        "agent_tasks_submitted_total",
        (("risk_level", "high"), ("source", "webhook"), ("task_type", "change")),
    )
    assert key in samples
    assert ("agent_runs_completed_total", (("outcome", "timed_out"),)) in samples
    assert ("agent_cost_usd_total", (("workspace", workspace.slug),)) in samples
    assert (
        "agent_celery_tasks_total",
        (("outcome", "failed"), ("task", "runs.step")),
    ) in samples


def test_requests_are_counted_and_timed_by_route_pattern(client, run):
    before = scrape(client)
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    client.get(f"/api/runs/{run.id}/")  # no credentials: a 4xx, counted as such
    after = scrape(client)

    healthz = {"method": "GET", "route": "healthz", "status": "2xx"}
    assert value(after, "agent_http_requests_total", **healthz) - value(
        before, "agent_http_requests_total", **healthz
    ) == pytest.approx(3)
    timed = value(after, "agent_http_request_seconds_count", method="GET", route="healthz")
    assert timed >= 3
    detail = {"method": "GET", "route": "api/runs/<uuid:pk>/", "status": "4xx"}
    assert value(after, "agent_http_requests_total", **detail) - value(
        before, "agent_http_requests_total", **detail
    ) == pytest.approx(1)
    # The pattern, not the path: no series carries a run id.
    assert not any(
        str(run.id) in dict(labels).get("route", "")
        for name, labels in after
        if name == "agent_http_requests_total"
    )


def test_spend_is_labelled_by_workspace_slug(client, run):
    task = Task.objects.select_related("workspace").get(pk=run.task_id)

    class Turn:
        type = "agent.model.turn.completed"
        data = {"model": "gpt-test", "tokens_in": 10, "tokens_out": 5, "cost_usd": 0.25}

    before = value(scrape(client), "agent_cost_usd_total", workspace=task.workspace.slug)
    metrics.events_observe(task, run, [Turn()])
    after = scrape(client)
    assert value(after, "agent_cost_usd_total", workspace=task.workspace.slug) - before == (
        pytest.approx(0.25)
    )
    assert not any(
        name == "agent_cost_usd_total" and dict(labels)["workspace"] == str(task.workspace_id)
        for name, labels in after
    )
