"""Shared rate limits: three worker processes calling one profile's model never pass its
requests per minute, counted where the requests arrive, and none fails; a token limit
waits (reported) instead of failing; git host calls wait for their hourly limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from runs import ratelimits
from runs.gitproviders.base import api_request
from tests.runs.providers.fakes import ModelServer, Turn

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.services, pytest.mark.slow]

RPM = 5
CALLS_EACH = 3


def test_three_workers_never_exceed_the_shared_requests_per_minute() -> None:
    arrivals: list[float] = []
    lock = threading.Lock()

    def script(seen, n):  # type: ignore[no-untyped-def]
        with lock:
            arrivals.append(time.time())
        return Turn(text="ok")

    name = f"shared-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    with ModelServer("openai", script, model="gpt-4o") as server:
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.runs.ratelimit_worker",
                    name,
                    server.base_url,
                    str(CALLS_EACH),
                    str(RPM),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(3)
        ]
        outputs = [w.communicate(timeout=180) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], [e[-2000:] for _, e in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sum(r["answered"] for r in results) == 3 * CALLS_EACH  # none failed
    assert sum(r["waits"] for r in results) > 0  # the ones over the limit waited
    assert len(arrivals) == 3 * CALLS_EACH
    per_minute = Counter(int(t // 60) for t in arrivals)
    assert max(per_minute.values()) <= RPM, per_minute
    # Nor does any 60 seconds.
    arrivals.sort()
    for i, start in enumerate(arrivals):
        assert sum(1 for t in arrivals[i:] if t < start + 60) <= RPM, [
            round(t - arrivals[0], 2) for t in arrivals
        ]


def test_a_token_limit_waits_and_reports_the_wait() -> None:
    key = f"test-tokens-{uuid.uuid4().hex[:8]}"
    waits: list[ratelimits.Wait] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > 3:
            raise RuntimeError("still waiting")  # the test need not wait the minute out

    tokens = ratelimits.per_minute(1000)
    for _ in range(2):
        ratelimits.acquire(key, requests=None, tokens=tokens, cost=400, sleep=sleep)
    assert not slept
    with pytest.raises(RuntimeError):
        ratelimits.acquire(
            key, requests=None, tokens=tokens, cost=400, on_wait=waits.append, sleep=sleep
        )
    assert waits and all(w.limit == "tokens" and w.wait_seconds > 0 for w in waits)


def test_git_host_calls_wait_for_the_hourly_limit(settings) -> None:  # type: ignore[no-untyped-def]
    settings.GIT_PROVIDER_REQUESTS_PER_HOUR = 2
    service = f"svc-{uuid.uuid4().hex[:8]}"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    client = httpx.Client(base_url="https://git.example.test", transport=transport)
    for _ in range(2):
        assert api_request(client, "GET", "/x", service=service, backoff_seconds=0).status_code
    waited: list[float] = []
    original = ratelimits.acquire

    def acquire(*args, **kwargs):  # type: ignore[no-untyped-def]
        def sleep(seconds: float) -> None:
            waited.append(seconds)
            raise TimeoutError("waits")

        return original(*args, **kwargs, sleep=sleep)

    ratelimits_acquire = ratelimits.acquire
    ratelimits.acquire = acquire  # type: ignore[assignment]
    try:
        with pytest.raises(TimeoutError):
            api_request(client, "GET", "/x", service=service, backoff_seconds=0)
    finally:
        ratelimits.acquire = ratelimits_acquire  # type: ignore[assignment]
    assert waited
