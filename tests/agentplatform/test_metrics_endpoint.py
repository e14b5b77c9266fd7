"""/metrics: access rules, text format, and counters that move when things happen."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run
from runs.services import task_submit
from tests.webhooks.test_webhook_support import GITHUB_SECRET, github_headers, github_post

ROOT = Path(__file__).resolve().parents[2]

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
        model_options={"provider": "scripted-priced", "script": demo.fix_script()},
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
    assert moved("agent_runs_started_total", model_profile="scripted-priced") == 1
    assert moved("agent_runs_completed_total", outcome="completed") == 1
    assert moved("agent_run_duration_seconds_count") == 1
    assert moved("agent_step_duration_seconds_count", step="running") >= 1
    assert moved("agent_step_duration_seconds_count", step="verifying") >= 1
    tool_calls = total(after, "agent_tool_calls_total") - total(before, "agent_tool_calls_total")
    assert tool_calls >= 1
    assert moved("agent_prs_created_total", provider=repository.provider) == 1
    tokens = total(after, "agent_model_tokens_total") - total(before, "agent_model_tokens_total")
    assert tokens > 0
    assert moved("agent_cost_usd_total", workspace=workspace.slug) > 0
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


def _uvicorn(tmp_path, name: str, env: dict) -> tuple[subprocess.Popen, int]:
    log_path = tmp_path / f"{name}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - the process owns it until killed
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "agentplatform.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", log_path.read_text())
        if found:
            return process, int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(log_path.read_text())


def test_two_web_processes_answer_the_same_counters(tmp_path, settings):
    """A delivery counted by one web process is in the scrape of the other."""
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
    }
    processes = [_uvicorn(tmp_path, name, env) for name in ("web-a", "web-b")]
    key = ("agent_webhook_deliveries_total", (("provider", "github"), ("result", "accepted")))
    try:
        (_, port_a), (_, port_b) = processes

        def scraped(port: int) -> dict:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }

        before = scraped(port_b).get(key, 0)
        body = json.dumps({"zen": "two processes", "hook_id": 7}).encode()
        answer = httpx.post(
            f"http://127.0.0.1:{port_a}/webhooks/github/",
            content=body,
            headers={**github_headers(body, "ping"), "Content-Type": "application/json"},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        assert scraped(port_b).get(key, 0) - before == 1
        assert scraped(port_a).get(key, 0) == scraped(port_b).get(key, 0)
    finally:
        for process, _ in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)


@pytest.mark.no_services
def test_reset_removes_only_the_files_of_processes_that_are_gone(tmp_path, monkeypatch):
    from jobs.metrics import multiprocess_dir_reset

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)
    (tmp_path / f"counter_{dead_pid}.db").write_bytes(b"x")
    (tmp_path / f"histogram_{dead_pid}.db").write_bytes(b"x")
    (tmp_path / f"counter_{os.getpid()}.db").write_bytes(b"x")
    multiprocess_dir_reset()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{os.getpid()}.db"]


def test_committed_events_move_their_counters_and_rolled_back_ones_do_not(client, workspace):
    from django.db import transaction

    from runs.timeline import PendingEvent, events_record
    from tests.factories import TaskFactory

    task = TaskFactory(workspace=workspace)
    run = Run.objects.create(task=task, run_no=1)
    events = [
        PendingEvent("agent.verification.failed", {"outcome": "tests_failed", "attempt_no": 1}),
        PendingEvent("agent.verification.errored", {"attempt_no": 2}),
        PendingEvent("agent.judge.completed", {"verdict": "approve"}),
        PendingEvent("agent.tool.call.denied", {"tool": "run_command", "tool_call_id": "c1"}),
    ]
    before = scrape(client)
    with transaction.atomic():
        events_record(task=task, run=run, events=events)
    with pytest.raises(RuntimeError), transaction.atomic():
        events_record(task=task, run=run, events=events)
        raise RuntimeError("the step lost its lease")
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("agent_verification_failures_total", category="tests_failed") == 1
    assert moved("agent_verification_failures_total", category="errored") == 1
    assert moved("agent_judge_verdicts_total", verdict="approve") == 1
    assert moved("agent_tool_calls_total", tool="run_command", status="denied") == 1
