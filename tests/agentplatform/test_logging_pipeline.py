"""One structured pipeline: JSON with tracebacks, secrets redacted, request and step context,
and uvicorn's own lines in the same format."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.http import HttpRequest
from django.urls import path
from rest_framework.test import APIClient

from agentplatform.logging import StructuredFormatter, secrets_register
from agentplatform.urls import urlpatterns as app_urlpatterns
from jobs import tracing
from jobs.models import OutboxEvent
from runs import demo
from runs.engine import run_drive_inline
from runs.models import Membership, Run, Task
from runs.services import task_submit
from tests.factories import RepositoryFactory, UserFactory

ROOT = Path(__file__).resolve().parents[2]
INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _boom(request: HttpRequest) -> None:
    raise RuntimeError("exploded while holding ghp_abcdefghijklmnopqrstuvwxyz0123456789")


urlpatterns = [path("boom", _boom), *app_urlpatterns]


def json_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.fixture
def json_log():
    """Every line that reaches the root logger, rendered as production renders it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(StructuredFormatter(json=True))
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: json_lines(stream.getvalue())
    root.removeHandler(handler)


def _record(msg: str, *args, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("some.library", logging.ERROR, __file__, 1, msg, args, exc_info)


@pytest.mark.no_services
def test_json_lines_keep_the_whole_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed", exc_info=sys.exc_info())
    line = json.loads(StructuredFormatter(json=True).format(record))
    assert "Traceback (most recent call last)" in line["exception"]
    assert "ValueError: boom" in line["exception"]
    assert "<traceback object" not in json.dumps(line)


@pytest.mark.no_services
def test_secrets_are_redacted_by_value_shape_and_field_name():
    secrets_register(["repository-webhook-secret-value"])
    formatter = StructuredFormatter(json=True)
    message = (
        "clone https://x-access-token:s3cr3t-pass@github.com/o/r.git failed; "
        "Authorization: Bearer abcdefghijklmnop; key sk-proj-abcdefghijklmnopqrst; "
        "token ghp_abcdefghijklmnopqrstuvwxyz0123456789; hook repository-webhook-secret-value"
    )
    try:
        raise RuntimeError(message)
    except RuntimeError:
        record = _record("%s", message, exc_info=sys.exc_info())
    record.api_key = "plain-value-1234"  # extra attributes are not rendered; the message is
    text = formatter.format(record)
    for secret in (
        "s3cr3t-pass",
        "x-access-token",
        "abcdefghijklmnop",
        "sk-proj-abcdefghijklmnopqrst",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "repository-webhook-secret-value",
    ):
        assert secret not in text, secret
    line = json.loads(text)
    assert "github.com/o/r.git" in line["event"]
    assert "[REDACTED]" in line["exception"]

    from agentplatform.logging import redact_value

    assert redact_value({"headers": {"Authorization": "x"}, "tokens_in": 12}) == {
        "headers": {"Authorization": "[REDACTED]"},
        "tokens_in": 12,
    }


@pytest.mark.django_db
@pytest.mark.urls(__name__)
def test_requests_log_4xx_at_info_and_5xx_at_error_with_the_request_id(client, json_log):
    missing = client.get("/no-such-page", HTTP_X_REQUEST_ID="req-4xx-1")
    assert missing.status_code == 404
    assert missing["X-Request-ID"] == "req-4xx-1"
    client.raise_request_exception = False
    failed = client.get("/boom")
    assert failed.status_code == 500
    request_id = failed["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    lines = json_log()

    four = [line for line in lines if line.get("request_id") == "req-4xx-1"]
    assert [(line["event"], line["level"], line["status"]) for line in four] == [
        ("http.response", "info", 404)
    ]
    five = [line for line in lines if line.get("request_id") == request_id]
    levels = {line["level"] for line in five}
    assert levels == {"error"}
    assert any("Traceback" in line.get("exception", "") for line in five)
    assert all(re.fullmatch(r"[0-9a-f]{32}", line["trace_id"]) for line in five)
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123456789" not in json.dumps(lines)


@pytest.mark.django_db
def test_api_request_trace_reaches_the_task_and_its_events(workspace, json_log):
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.MEMBER)
    api = APIClient()
    api.force_authenticate(user)
    repo = RepositoryFactory(workspace=workspace)
    response = api.post(
        "/api/tasks/",
        {"repository": repo.pk, "instruction": "Fix add()"},
        format="json",
        HTTP_TRACEPARENT=INCOMING,
    )
    assert response.status_code == 202, response.content
    (line,) = [line for line in json_log() if line["event"] == "http.response"]
    assert line["workspace_id"] == workspace.pk
    assert line["trace_id"] == INCOMING.split("-")[1]
    task = Task.objects.get()
    assert tracing.trace_id_of(task.traceparent) == INCOMING.split("-")[1]
    payloads = [row.payload for row in OutboxEvent.objects.filter(payload__taskid=str(task.id))]
    assert payloads
    spans = {tracing.traceparent_parse(p["traceparent"]) for p in payloads}
    assert {trace for trace, _, _ in spans} == {INCOMING.split("-")[1]}
    assert INCOMING.split("-")[2] not in {span for _, span, _ in spans}

    other = api.post(
        "/api/tasks/",
        {"repository": repo.pk, "instruction": "Again"},
        format="json",
        HTTP_TRACEPARENT="00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )
    assert other.status_code == 202
    second = Task.objects.exclude(pk=task.pk).get()
    assert tracing.trace_id_of(second.traceparent) not in (None, "0" * 32)


@pytest.mark.django_db(transaction=True)
def test_a_steps_log_lines_carry_the_run_id_and_trace_id(workspace, repository, json_log):
    with tracing.trace_scope(INCOMING):
        submission = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"provider": "scripted", "script": demo.fix_script()},
        )
    run = run_drive_inline(run_id=submission.run.id)
    assert run.status == Run.Status.COMPLETED
    lines = [line for line in json_log() if line["event"] == "step.committed"]
    assert len(lines) >= 8
    for line in lines:
        assert line["run_id"] == str(run.id)
        assert line["task_id"] == str(submission.task.id)
        assert line["trace_id"] == INCOMING.split("-")[1]


@pytest.mark.django_db
def test_uvicorn_logs_through_the_same_json_pipeline(tmp_path):
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "LOG_JSON": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "uvicorn.log"
    with open(log_path, "wb") as log_file:
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
        try:
            port = None
            deadline = time.monotonic() + 30
            while port is None and time.monotonic() < deadline:
                assert process.poll() is None, log_path.read_text()
                found = re.search(r"http://127\.0\.0\.1:(\d+)", log_path.read_text())
                port = int(found.group(1)) if found else None
                time.sleep(0.1)
            assert port, log_path.read_text()
            import httpx

            response = httpx.get(
                f"http://127.0.0.1:{port}/missing-page", headers={"X-Request-ID": "uv-1"}
            )
            assert response.status_code == 404
            assert response.headers["X-Request-ID"] == "uv-1"
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
    text = log_path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is JSON, uvicorn's included
    loggers = {line["logger"] for line in parsed}
    assert "uvicorn.error" in loggers
    assert any(
        line.get("request_id") == "uv-1" and line["status"] == 404 and line["level"] == "info"
        for line in parsed
    )


@pytest.mark.django_db
def test_a_runs_own_secrets_are_redacted_once_its_step_binds(workspace, json_log):
    from agentplatform.observability import step_bind
    from tests.factories import TaskFactory

    repo = RepositoryFactory(workspace=workspace, webhook_secret="per-repo-hook-secret-77")
    task = TaskFactory(
        workspace=workspace, repository=repo, model_options={"api_key": "per-task-model-key-99"}
    )
    run = Run.objects.create(task=task, run_no=1)
    step_bind(run, 0)
    logging.getLogger("some.library").warning(
        "echo per-repo-hook-secret-77 and per-task-model-key-99"
    )
    line = json_log()[-1]
    assert line["event"] == "echo [REDACTED] and [REDACTED]"
    assert line["run_id"] == str(run.id)
    assert line["trace_id"] == tracing.trace_id_of(task.traceparent)


@pytest.mark.django_db
def test_a_webhook_trace_reaches_the_task_it_creates(client, settings, json_log):
    from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, github_post
    from webhooks.models import WebhookReceipt
    from webhooks.processing import webhook_receipt_process

    RepositoryFactory(external_id="octo/traced", webhook_secret=REPOSITORY_SECRET)
    payload = corpus("github", "issues/labeled")
    payload["label"]["name"] = "agent"
    payload["repository"]["full_name"] = "octo/traced"
    response = github_post(client, payload, "issues", delivery="traced-1", secret=REPOSITORY_SECRET)
    assert response.status_code == 202
    (line,) = [line for line in json_log() if line["event"] == "http.response"]
    receipt = WebhookReceipt.objects.get()
    assert tracing.trace_id_of(receipt.headers["traceparent"]) == line["trace_id"]

    tracing.trace_clear()  # processed later, by a worker or a sweep, outside the request
    webhook_receipt_process(receipt_id=receipt.pk)
    task = Task.objects.get()
    assert tracing.trace_id_of(task.traceparent) == line["trace_id"]
    submitted = OutboxEvent.objects.get(type="agent.task.submitted")
    assert tracing.trace_id_of(submitted.payload["traceparent"]) == line["trace_id"]


@pytest.mark.django_db
def test_the_heartbeat_thread_logs_in_its_steps_context(monkeypatch, settings, json_log):
    import structlog

    from runs import heartbeat as heartbeats
    from runs import lease as leases

    def refuse(leases):
        raise RuntimeError("database unreachable")

    monkeypatch.setattr(heartbeats, "leases_renew", refuse)
    settings.RUN_LEASE_SECONDS = 1
    structlog.contextvars.bind_contextvars(task_id="task-in-context", trace_id="b" * 32)
    try:
        lease = leases.Lease(run_id=__import__("uuid").uuid4(), owner="w", attempt=1, step_no=0)
        with heartbeats.Heartbeat(lease):
            time.sleep(1.3)
    finally:
        structlog.contextvars.unbind_contextvars("task_id", "trace_id")
    failed = [line for line in json_log() if line["event"] == "heartbeat.failed"]
    assert failed
    assert {(line["task_id"], line["trace_id"]) for line in failed} == {
        ("task-in-context", "b" * 32)
    }
    assert "RuntimeError: database unreachable" in failed[0]["exception"]


@pytest.mark.django_db
def test_a_task_run_inline_keeps_its_callers_context():
    import uuid

    import structlog

    from runs.tasks import run_step

    structlog.contextvars.bind_contextvars(request_id="caller-request")
    tracing.trace_activate(INCOMING)
    try:
        assert run_step.apply(args=(str(uuid.uuid4()), 0)).get() == "skipped"
        assert structlog.contextvars.get_contextvars()["request_id"] == "caller-request"
        assert tracing.traceparent_current() == INCOMING
    finally:
        tracing.trace_clear()
        structlog.contextvars.unbind_contextvars("request_id")


@pytest.mark.no_services
def test_model_profile_keys_are_redacted(monkeypatch, settings):
    from agentplatform.logging import secrets_from_settings

    monkeypatch.setenv("SELF_HOSTED_LLM_KEY", "profile-key-from-env-31337")
    settings.MODEL_PROFILES = {
        **settings.MODEL_PROFILES,
        "local": {"provider": "openai", "api_key_env": "SELF_HOSTED_LLM_KEY"},
        "inline": {"provider": "openai", "api_key": "inline-profile-key-4242"},
    }
    from django.conf import settings as live

    found = secrets_from_settings(live)
    assert "profile-key-from-env-31337" in found and "inline-profile-key-4242" in found
    record = _record("calling with profile-key-from-env-31337 / inline-profile-key-4242")
    text = StructuredFormatter(json=True).format(record)
    assert "31337" not in text and "4242" not in text


@pytest.mark.django_db
def test_an_accepted_delivery_is_told_on_its_request_line(json_log, client, settings):
    """One line per delivery: the access line carries what the delivery was and its receipt."""
    from tests.webhooks.test_webhook_support import GITHUB_SECRET, github_post

    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    response = github_post(client, {"zen": "z", "hook_id": 1}, "ping", delivery="d-1")
    assert response.status_code == 202, response.content
    lines = [line for line in json_log() if line.get("delivery_id") == "d-1"]
    assert [line["event"] for line in lines] == ["http.response"], lines
    (line,) = lines
    assert line["receipt_id"] == response.json()["receipt_id"]
    assert (line["provider"], line["webhook_event"], line["status"]) == ("github", "ping", 202)
