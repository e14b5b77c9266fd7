"""GET /api/runs/{id}/stream through a real uvicorn server and a real SSE client.

Events are committed by this process exactly as workers commit them (events_record in a
transaction); the server in its own process is woken through Redis pub/sub and reads
them from the test database.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection, transaction
from httpx_sse import aconnect_sse, connect_sse

from agentplatform.api.auth import api_token_issue
from runs.models import Membership, Run, Task
from runs.timeline import PendingEvent, events_record
from tests.factories import TaskFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


class ApiServer:
    """uvicorn serving the ASGI app on a free port, pointed at the test database."""

    def __init__(self, log_dir: Path, keepalive: float = 15.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        db = settings.DATABASES["default"]
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "AGENTPLATFORM_VAR_DIR": str(settings.VAR_DIR),
            "SSE_KEEPALIVE_SECONDS": str(keepalive),
            "API_THROTTLE_USER_RATE": "100000/minute",
            "API_THROTTLE_TOKEN_RATE": "100000/minute",
        }
        self.log_path = log_dir / f"uvicorn-{self.port}.log"
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "agentplatform.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--timeout-graceful-shutdown",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"uvicorn not ready: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    api = ApiServer(tmp_path, keepalive=1.0)
    yield api
    api.stop()


@pytest.fixture
def run_and_token() -> tuple[Run, str]:
    task = TaskFactory()
    user = UserFactory()
    Membership.objects.create(workspace=task.workspace, user=user)
    run = Run.objects.create(task=task, run_no=1)
    _, secret = api_token_issue(user=user)
    return run, secret


def record(run: Run, *types: str, terminal: str | None = None) -> float:
    """Commit events like a step does; returns the time just before the commit."""
    with transaction.atomic():
        if terminal:
            Run.objects.filter(pk=run.pk).update(status=terminal)
        events_record(
            task=run.task, run=run, events=[PendingEvent(t, {"n": i}) for i, t in enumerate(types)]
        )
        before_commit = time.monotonic()
    return before_commit


def _complete_all(runs: list[Run]) -> None:
    # Runs in a helper thread: its database connection must not outlive it.
    try:
        for target in runs:
            record(target, "agent.run.completed", terminal=Run.Status.COMPLETED)
    finally:
        connection.close()


def _headers(secret: str, last: int | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if last is not None:
        headers["Last-Event-ID"] = str(last)
    return headers


def test_replays_then_delivers_live_events_soon_after_commit(server, run_and_token):
    run, secret = run_and_token
    record(run, "agent.run.queued")
    received: list[tuple[int, float]] = []
    connected = threading.Event()
    errors: list[BaseException] = []

    def listen() -> None:
        try:
            with (
                httpx.Client(timeout=30) as client,
                connect_sse(
                    client,
                    "GET",
                    f"{server.url}/api/runs/{run.id}/stream",
                    headers=_headers(secret),
                ) as source,
            ):
                assert source.response.headers["content-type"].startswith("text/event-stream")
                for sse in source.iter_sse():
                    if sse.retry is not None:
                        connected.set()
                    if sse.id:
                        received.append((int(sse.id), time.monotonic()))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(10), errors
    latencies = []
    for _ in range(5):
        time.sleep(0.05)
        count = len(received)
        committed = record(run, "agent.run.status.changed")
        deadline = time.monotonic() + 5
        while len(received) == count and time.monotonic() < deadline:
            time.sleep(0.001)
        latencies.append(received[-1][1] - committed)
    record(run, "agent.run.completed", "agent.task.completed", terminal=Run.Status.COMPLETED)
    thread.join(10)

    assert not thread.is_alive(), "the stream did not end after the terminal event"
    assert not errors, errors
    assert [seq for seq, _ in received] == list(range(1, 9))
    # The issue's target is 100 ms from commit; this bound is generous for a loaded CI
    # box, bench/bench_sse.py measures the real figure.
    assert max(latencies) < 1.0, latencies


def test_resume_with_last_event_id_loses_and_duplicates_nothing(server, run_and_token):
    run, secret = run_and_token
    record(run, *["agent.run.status.changed"] * 5)
    seen: list[int] = []
    with httpx.Client(timeout=30) as client:
        with connect_sse(
            client, "GET", f"{server.url}/api/runs/{run.id}/stream", headers=_headers(secret)
        ) as source:
            for sse in source.iter_sse():
                if sse.id:
                    seen.append(int(sse.id))
                if len(seen) == 3:
                    break
        # Events committed while the client is away.
        record(run, *["agent.tool.call.completed"] * 3)
        with connect_sse(
            client,
            "GET",
            f"{server.url}/api/runs/{run.id}/stream",
            headers=_headers(secret, last=seen[-1]),
        ) as source:
            for sse in source.iter_sse():
                if sse.id:
                    seen.append(int(sse.id))
                if len(seen) == 8:
                    record(run, "agent.run.failed", "agent.task.failed", terminal=Run.Status.FAILED)
        # Resuming after the end replays nothing and ends at once.
        with connect_sse(
            client,
            "GET",
            f"{server.url}/api/runs/{run.id}/stream",
            headers=_headers(secret, last=seen[-1]),
        ) as source:
            assert [sse.id for sse in source.iter_sse() if sse.id] == []

    assert seen == list(range(1, 11))


def test_keepalive_comments_are_sent_while_nothing_happens(server, run_and_token):
    run, secret = run_and_token
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "GET", f"{server.url}/api/runs/{run.id}/stream", headers=_headers(secret)
        ) as response,
    ):
        text = ""
        for chunk in response.iter_text():
            text += chunk
            if ": keep-alive" in text:
                break
    assert ": keep-alive" in text


def test_stream_is_scoped_and_authenticated(server, run_and_token):
    run, secret = run_and_token
    outsider_secret = api_token_issue(user=UserFactory())[1]
    url = f"{server.url}/api/runs/{run.id}/stream"

    anonymous = httpx.get(url, timeout=10)
    outsider = httpx.get(url, headers=_headers(outsider_secret), timeout=10)
    bad_cursor = httpx.get(url, headers={**_headers(secret), "Last-Event-ID": "x"}, timeout=10)

    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"] == "application/problem+json"
    assert outsider.status_code == 404
    assert outsider.json()["code"] == "not_found"
    assert bad_cursor.status_code == 400


def test_hundred_open_streams_do_not_block_other_requests(server, run_and_token):
    run, secret = run_and_token
    other_task = Task.objects.get(pk=run.task_id)
    runs = [run] + [
        Run.objects.create(
            task=TaskFactory(workspace=other_task.workspace, repository=other_task.repository),
            run_no=1,
        )
        for _ in range(3)
    ]

    async def scenario() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            connected = 0
            all_connected = asyncio.Event()
            delivered: list[int] = []

            async def stream(target: Run) -> None:
                nonlocal connected
                async with aconnect_sse(
                    client,
                    "GET",
                    f"{server.url}/api/runs/{target.id}/stream",
                    headers=_headers(secret),
                ) as source:
                    async for sse in source.aiter_sse():
                        if sse.retry is not None:
                            connected += 1
                            if connected == 100:
                                all_connected.set()
                        if sse.event == "agent.run.completed":
                            delivered.append(1)

            streams = [asyncio.create_task(stream(runs[i % len(runs)])) for i in range(100)]
            await asyncio.wait_for(all_connected.wait(), 30)
            started = time.monotonic()
            responses = await asyncio.gather(
                *[
                    client.get(f"{server.url}/api/runs/{run.id}/", headers=_headers(secret))
                    for _ in range(20)
                ],
                client.get(f"{server.url}/healthz"),
            )
            elapsed = time.monotonic() - started
            await asyncio.to_thread(_complete_all, runs)
            await asyncio.wait_for(asyncio.gather(*streams), 30)
            return {
                "statuses": [r.status_code for r in responses],
                "elapsed": elapsed,
                "delivered": len(delivered),
            }

    outcome = asyncio.run(scenario())

    assert set(outcome["statuses"]) == {200}
    assert outcome["delivered"] == 100
    # Generous: the point is that the requests are served at all while 100 streams
    # wait; bench/bench_sse.py reports the latency ratio.
    assert outcome["elapsed"] < 10, outcome
