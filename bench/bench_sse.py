"""Live stream figures: commit-to-client latency, and request latency with 100 open streams.

Starts a real uvicorn server on a throwaway PostgreSQL database
(``<DATABASE_TEST_NAME or test>_bench_sse``) with the Redis of REDIS_URL, and prints:

- delivery: commit of an event (in this process, as a worker commits) to its arrival at
  an httpx-sse client, median and p95, against the round-trip of a plain GET as baseline;
- load: GET /api/runs/{id}/ latency with 100 open streams, against the same with none.

    DATABASE_TEST_NAME=test_h6 REDIS_URL=redis://127.0.0.1:6379/6 \
        .venv/bin/python bench/bench_sse.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["DATABASE_TEST_NAME"] = f"{os.environ.get('DATABASE_TEST_NAME', 'test')}_bench_sse"

import django

django.setup()

import httpx  # noqa: E402
from django.db import connection  # noqa: E402
from httpx_sse import aconnect_sse, connect_sse  # noqa: E402

SAMPLES = int(os.environ.get("BENCH_SAMPLES", 30))
STREAMS = 100


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _delivery(server, run, secret) -> tuple[list[float], list[float]]:
    from tests.agentplatform.api.test_sse_stream import record

    headers = {"Authorization": f"Bearer {secret}"}
    arrivals: list[float] = []
    connected = threading.Event()

    def listen() -> None:
        with (
            httpx.Client(timeout=60) as client,
            connect_sse(
                client, "GET", f"{server.url}/api/runs/{run.id}/stream", headers=dict(headers)
            ) as source,
        ):
            for sse in source.iter_sse():
                if sse.retry is not None:
                    connected.set()
                if sse.id:
                    arrivals.append(time.perf_counter())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    connected.wait(10)
    latencies = []
    for _ in range(SAMPLES):
        count = len(arrivals)
        committed = record(run, "agent.run.status.changed")
        while len(arrivals) == count:
            time.sleep(0.0002)
        latencies.append(arrivals[-1] - committed)
        time.sleep(0.02)
    record(run, "agent.run.completed", terminal="completed")
    thread.join(10)
    round_trips = []
    with httpx.Client(timeout=10) as client:
        for _ in range(SAMPLES):
            started = time.perf_counter()
            client.get(f"{server.url}/api/runs/{run.id}/", headers=headers)
            round_trips.append(time.perf_counter() - started)
    return latencies, round_trips


async def _requests_latency(server, run, secret, streams: int) -> list[float]:
    headers = {"Authorization": f"Bearer {secret}"}
    limits = httpx.Limits(max_connections=STREAMS + 50)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        ready = asyncio.Semaphore(0)

        async def hold() -> None:
            async with aconnect_sse(
                client, "GET", f"{server.url}/api/runs/{run.id}/stream", headers=dict(headers)
            ) as source:
                async for sse in source.aiter_sse():
                    if sse.retry is not None:
                        ready.release()

        holders = [asyncio.create_task(hold()) for _ in range(streams)]
        for _ in range(streams):
            await ready.acquire()
        timings = []
        for _ in range(SAMPLES):
            started = time.perf_counter()
            response = await client.get(f"{server.url}/api/runs/{run.id}/", headers=headers)
            assert response.status_code == 200, (response.status_code, response.text[:300])
            timings.append(time.perf_counter() - started)
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        return timings


def main() -> None:
    from agentplatform.api.auth import api_token_issue
    from runs.models import Membership, Run
    from tests.agentplatform.api.test_sse_stream import ApiServer
    from tests.factories import TaskFactory, UserFactory

    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    server = None
    try:
        task = TaskFactory()
        user = UserFactory()
        Membership.objects.create(workspace=task.workspace, user=user)
        secret = api_token_issue(user=user)[1]
        server = ApiServer(Path(tempfile.mkdtemp(prefix="bench-sse-")))
        live_run = Run.objects.create(task=task, run_no=1)
        latencies, round_trips = _delivery(server, live_run, secret)
        idle_run = Run.objects.create(task=TaskFactory(workspace=task.workspace), run_no=1)
        quiet = asyncio.run(_requests_latency(server, idle_run, secret, 0))
        loaded = asyncio.run(_requests_latency(server, idle_run, secret, STREAMS))
    finally:
        if server is not None:
            server.stop()
        connection.creation.destroy_test_db(old_name, verbosity=0)

    ms = 1000
    print(
        f"delivery commit->client: median {statistics.median(latencies) * ms:.1f} ms, "
        f"p95 {_p(latencies, 0.95) * ms:.1f} ms, max {max(latencies) * ms:.1f} ms "
        f"(target 100 ms)"
    )
    print(
        f"baseline GET round-trip: median {statistics.median(round_trips) * ms:.1f} ms; "
        f"ratio delivery/GET = "
        f"{statistics.median(latencies) / statistics.median(round_trips):.2f}"
    )
    print(
        f"GET /api/runs/{{id}}/ with 0 streams: median {statistics.median(quiet) * ms:.1f} ms,"
        f" p95 {_p(quiet, 0.95) * ms:.1f} ms"
    )
    print(
        f"GET /api/runs/{{id}}/ with {STREAMS} open streams: median "
        f"{statistics.median(loaded) * ms:.1f} ms, p95 {_p(loaded, 0.95) * ms:.1f} ms; "
        f"ratio loaded/quiet = {statistics.median(loaded) / statistics.median(quiet):.2f}"
    )


if __name__ == "__main__":
    main()
