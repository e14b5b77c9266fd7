"""What the benchmark runs on: its own database, its child processes, and small
probes of ports, CPU and git."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

from agentplatform import supervision
from runs.management.process_groups import process_groups_stop

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GITHUB_SECRET = "bench-webhook-secret"


def bench_environment() -> dict[str, str]:
    url = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench"))
    name = (url.path.lstrip("/") or "bench") + "_bench"
    env = dict(os.environ)
    env.update(
        DATABASE_URL=urlunparse(url._replace(path="/" + name)),
        BENCH_DATABASE=name,
        BENCH_ADMIN_URL=urlunparse(url._replace(path="/postgres")),
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        DJANGO_SETTINGS_MODULE="bench.settings",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-secret-key-long-enough-0123456789-abcdef"),
        GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
        API_THROTTLE_USER_RATE="",
        API_THROTTLE_TOKEN_RATE="",
        API_THROTTLE_ANON_RATE="",
        AGENT_MODEL="scripted",
        LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "INFO"),
        PYTHONPATH=str(ROOT),
        AGENTPLATFORM_VAR_DIR=tempfile.mkdtemp(prefix="agentplatform-bench-"),
        # The bench's sample repositories live in temporary directories.
        LOCAL_REPOSITORY_ROOTS=tempfile.gettempdir(),
    )
    env.setdefault("CELERY_BROKER_URL", env["REDIS_URL"])
    return env


def database_recreate(env: dict[str, str], name: str = "", template: str = "") -> None:
    """Database ``name`` (the benchmark's own by default) dropped if it exists and
    created anew: empty, or as a copy of ``template``."""
    import psycopg

    name = name or env["BENCH_DATABASE"]
    database_drop(env, name)
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(env["BENCH_ADMIN_URL"], autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')


def database_drop(env: dict[str, str], name: str = "") -> None:
    """Database ``name`` (the benchmark's own by default) dropped if it exists, whoever
    is connected to it."""
    import psycopg

    name = name or env["BENCH_DATABASE"]
    with psycopg.connect(env["BENCH_ADMIN_URL"], autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Processes:
    """Child processes this benchmark started; stopped by their own pid only."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.children: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, argv: list[str], cwd: Path = ROOT, **env: str
    ) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115
        # Its own group, and SIGTERM from the kernel should the benchmark be killed.
        child = supervision.spawn(argv, cwd=cwd, env={**self.env, **env}, stdout=log, stderr=log)
        self.children.append(child)
        return child

    def stop(self, child: subprocess.Popen[bytes]) -> None:
        self.stop_all([child])

    def stop_all(self, children: list[subprocess.Popen[bytes]] | None = None) -> None:
        """Stop these children (all this benchmark started, by default), together."""
        children = list(self.children if children is None else children)
        process_groups_stop(children, timeout=20)
        self.children = [child for child in self.children if child not in children]


def broker_queue_keys(extra: list[str] | None = None) -> list[str]:
    """The Redis lists of the platform's queues (and ``extra`` ones), with the lists of
    their priority steps."""
    from agentplatform.dashboard import REDIS_PRIORITY_SEPARATOR, REDIS_PRIORITY_STEPS, queue_names

    queues = [*queue_names(), *(extra or [])]
    return [
        *queues,
        *(f"{q}{REDIS_PRIORITY_SEPARATOR}{step}" for q in queues for step in REDIS_PRIORITY_STEPS),
    ]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def redis_ping(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children (from /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            todo.extend(int(c) for c in children)
        except (OSError, IndexError, ValueError):
            continue
    return total


def git_run(*args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()
