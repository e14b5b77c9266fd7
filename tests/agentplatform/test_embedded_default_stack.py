"""`make serve` on the embedded default, as a newcomer meets it: nothing configured, run
as root as CI runs it. The platform starts its own PostgreSQL and Valkey under var/, the
real payloads of the webhook corpus are accepted, the API lists runs and answers every
operation of its schema as documented (schemathesis), the dashboard's queue tiles read
numbers, and Ctrl-C leaves no server running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentplatform import embedded
from tests.conftest import free_port, wait_for
from tests.webhooks.test_webhook_support import (
    CORPUS,
    GITHUB_SECRET,
    GITLAB_EVENTS,
    GITLAB_TOKEN,
    sign,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.no_services, pytest.mark.slow]

CONFIGURED = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "DJANGO_SETTINGS_MODULE",
    "DATABASE_TEST_NAME",
    "AGENTPLATFORM_SERVICES_DIR",
    "PROMETHEUS_MULTIPROC_DIR",
    "LOCAL_REPOSITORY_ROOTS",
}


def unconfigured_env(var: Path, **extra: str) -> dict[str, str]:
    """This environment less every setting of the test run: the embedded default."""
    env = {k: v for k, v in os.environ.items() if k not in CONFIGURED}
    return {**env, "AGENTPLATFORM_VAR_DIR": str(var), "COLUMNS": "120", **extra}


def manage(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def server_pids(var: Path) -> list[int]:
    """Live PostgreSQL and Valkey processes whose data directory is under ``var``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
            exe = os.readlink(entry / "exe")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z" and cwd.startswith(str(var)) and exe.endswith(("postgres", "-server")):
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def served(
    tmp_path: Path, embedded_var: Path
) -> Iterator[tuple[str, subprocess.Popen[str], Path, str]]:
    """``make serve``'s commands with nothing configured."""
    var = embedded_var
    env = unconfigured_env(
        var,
        GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
        GITLAB_WEBHOOK_TOKEN=GITLAB_TOKEN,
        GITLAB_COMMAND_USERS="root",
        DJANGO_SUPERUSER_PASSWORD="embedded-admin-password",
    )
    # What `make serve` runs: setup's collectstatic, migrate, then serve.
    manage(env, "collectstatic", "--noinput", "-v", "0")
    manage(env, "migrate", "-v", "0")
    manage(env, "createsuperuser", "--noinput", "--username=admin", "--email=admin@example.com")
    token = manage(env, "issue_token", "--user", "admin").strip().splitlines()[-1]
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            return False

    try:
        wait_for(healthy, timeout=90, interval=0.3, message="serve answering")
        yield url, serve, var, token
    finally:
        if serve.poll() is None:
            # Ctrl-C first: serve's web, worker and beat run in sessions of their own,
            # which only serve itself stops.
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        log.close()


def corpus_deliveries() -> Iterator[tuple[str, dict[str, str], bytes]]:
    for path in sorted((CORPUS / "github").glob("*/*.json")):
        body = path.read_bytes()
        yield (
            "/webhooks/github/",
            {
                "X-GitHub-Event": path.parent.name,
                "X-GitHub-Delivery": path.name,
                "X-GitHub-Hook-ID": "7",
                "X-Hub-Signature-256": sign(body),
            },
            body,
        )
    for path in sorted((CORPUS / "gitlab").glob("*.json")):
        body = path.read_bytes()
        yield (
            "/webhooks/gitlab/",
            {
                "X-Gitlab-Event": GITLAB_EVENTS[json.loads(body)["object_kind"]],
                "X-Gitlab-Token": GITLAB_TOKEN,
                "X-Gitlab-Event-UUID": f"uuid-{path.name}",
                "Idempotency-Key": path.name,
            },
            body,
        )


def test_serve_on_the_embedded_default_answers_and_stops_its_servers(served) -> None:
    url, serve, var, token = served
    state = json.loads((var / "embedded.json").read_text())
    assert (var / "postgres" / "PG_VERSION").exists()
    assert server_pids(var)

    deliveries = list(corpus_deliveries())
    assert len(deliveries) >= 60  # the corpus: 57 GitHub and 6 GitLab payloads
    answers = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for path, headers, body in deliveries:
            headers = {**headers, "Content-Type": "application/json"}
            answers[headers.get("X-GitHub-Delivery") or headers["Idempotency-Key"]] = client.post(
                path, content=body, headers=headers
            ).status_code
        assert {k: v for k, v in answers.items() if not 200 <= v < 300} == {}

        runs = client.get("/api/runs/", headers={"Authorization": f"Bearer {token}"})
        assert runs.status_code == 200, runs.text[:2000]
        assert "results" in runs.json()

        # Every operation of the live schema, through the real server and its database:
        # no 5xx, and every answer as documented (schemathesis.toml's checks).
        schemathesis = subprocess.run(
            [
                str(Path(sys.executable).with_name("schemathesis")),
                "run",
                f"{url}/api/schema/",
                "--header",
                f"Authorization: Bearer {token}",
                "--checks",
                "all",
                "--max-examples",
                "5",
                "--generation-deterministic",
                "--workers",
                "1",
                "--exclude-path",
                "/api/runs/{id}/stream",
                "--phases",
                "examples,fuzzing",
                "--request-timeout",
                "30",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert schemathesis.returncode == 0, schemathesis.stdout[-6000:] + schemathesis.stderr

        login_page = client.get("/admin/login/")
        assert "csrftoken" in client.cookies, (login_page.status_code, login_page.headers)
        login = client.post(
            "/admin/login/?next=/admin/dashboard/",
            data={
                "username": "admin",
                "password": "embedded-admin-password",
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
                "next": "/admin/dashboard/",
            },
            follow_redirects=True,
        )
        assert login.status_code == 200
        page = client.get("/admin/dashboard/").text
        queues = re.findall(
            r'data-metric="queue-([^"]+)"><div class="label">[^<]*</div>'
            r'<div class="value">([^<]*)</div>',
            page,
        )
        assert {name for name, _ in queues} >= {"agent", "verify", "events", "webhooks"}
        assert all(value.strip().isdigit() for _, value in queues), queues

    # Ctrl-C: serve stops its children, then the servers it held.
    os.killpg(serve.pid, signal.SIGINT)
    assert serve.wait(timeout=90) == 0
    assert not server_pids(var)
    assert not embedded._alive(state["postgres"]["pid"])
    assert not embedded._alive(state["redis"]["pid"])
