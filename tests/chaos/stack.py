"""The platform under test: its own PostgreSQL and Redis, web, two workers and beat.

Deployed as the README's production section deploys it (the web server with two workers, Celery
workers on every queue, the leader-elected beat), with a shorter run lease so crashed
steps are found in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentplatform import supervision
from tests.chaos.fakegithub import FakeGitHub
from tests.chaos.modelserver import PROFILE, ScriptedModelServer
from tests.chaos.services import Child, PostgresCluster, RedisServer, free_port, remove_tree

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK_SECRET = "chaos-webhook-secret"
GITHUB_TOKEN = "ghp_" + "c" * 36
LEASE_SECONDS = 5
# A claimed unit of work (a webhook, a consumer delivery) of a killed worker is retried
# when this lease runs out; the deployment default (300 s) is sized for slow handlers.
WORK_LEASE_SECONDS = 20
STALL_SECONDS = 10
# Beat's safety nets, every 10 s as deployed, look every 2-3 s here.
REAP_EVERY = ("zombie reaper=2", "outbox sweep=3", "work sweep=3")
# A delivery whose processing keeps failing is retried 5 times with doubling delays from
# this one before it is dead-lettered: about 8-15 s in all instead of the deployment's
# 30-60 s (a 2 s base), the same retries sooner.
WEBHOOK_RETRY_BASE_SECONDS = 0.5
# Settings the children inherit from the caller's environment that would point them at
# someone else's services.
FOREIGN = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "EVENT_STREAM_REDIS_URL",
    "DATABASE_TEST_NAME",
    "DJANGO_SETTINGS_MODULE",
    "AGENTPLATFORM_VAR_DIR",
    "SANDBOX_ROOT",
    "PROMETHEUS_MULTIPROC_DIR",
)


def python_command() -> str:
    return sys.executable


class Stack:
    def __init__(self, *, keep: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="agentplatform-chaos-"))
        self.keep = keep
        self.log_dir = self.root / "logs"
        self.log_dir.mkdir()
        self.postgres: PostgresCluster | None = None
        self.redis: RedisServer | None = None
        self.github = FakeGitHub()
        # The agent's model: the scripted agent behind an OpenAI-compatible endpoint.
        self.model = ScriptedModelServer(short_fix_script())
        self.web_port = free_port()
        self.children: dict[str, Child] = {}
        self.extra_beats: list[Child] = []
        self.env: dict[str, str] = {}
        # What it starts, for its watchdog and for the next run's sweep should it be killed.
        self.run_dir = ROOT / "var" / "run"
        self.pid_file: supervision.PidFile | None = None
        self.watchdog: supervision.Watchdog | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if swept := supervision.sweep(self.run_dir):
            print(f"stopped {swept} processes left by an earlier chaos run", flush=True)
        self.pid_file = supervision.PidFile(self.run_dir, "chaos")
        self.watchdog = supervision.Watchdog(self.pid_file)
        self.postgres = PostgresCluster(self.root, self.pid_file)
        self.postgres.create_database("chaos")
        self.redis = RedisServer(self.root, self.pid_file)
        base = {k: v for k, v in os.environ.items() if k not in FOREIGN}
        model_options = {"profile": PROFILE}
        self.env = {
            **base,
            "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
            "DATABASE_URL": self.postgres.url,
            "CELERY_BROKER_URL": self.redis.url,
            "REDIS_URL": self.redis.url,
            "SECRET_KEY": "chaos-secret-key-long-enough-for-the-production-check-0123456789",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "AGENTPLATFORM_VAR_DIR": str(self.root / "var"),
            "LOCAL_REPOSITORY_ROOTS": str(self.root),
            "RUN_LEASE_SECONDS": str(LEASE_SECONDS),
            "RUN_STALL_SECONDS": str(STALL_SECONDS),
            "WORK_LEASE_SECONDS": str(WORK_LEASE_SECONDS),
            "WEBHOOK_PROCESS_RETRY_BASE_SECONDS": str(WEBHOOK_RETRY_BASE_SECONDS),
            "GITHUB_API_URL": self.github.url,
            "GITHUB_TOKEN": GITHUB_TOKEN,
            "WEBHOOK_TASK_MODEL_OPTIONS": json.dumps(model_options),
            "MODEL_PROFILES": json.dumps({PROFILE: self.model.profile()}),
            # The burst measures what the API takes, not the throttle.
            "API_THROTTLE_USER_RATE": "",
            "API_THROTTLE_TOKEN_RATE": "",
            "API_THROTTLE_ANON_RATE": "",
            "LOG_JSON": "false",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update({k: v for k, v in self.env.items() if k not in base})
        os.environ.update({k: self.env[k] for k in ("DATABASE_URL", "CELERY_BROKER_URL")})
        self.manage("migrate", "--noinput", "-v", "0")
        # The safety nets look as often as the short leases need: a killed worker's run is
        # taken over within a lease and a reaper tick (an operator's interval edit).
        self.manage("beat_schedules", *(a for e in REAP_EVERY for a in ("--every", e)))
        celery = [python_command(), "-m", "celery", "-A", "agentplatform"]
        self._add(
            "web",
            [
                python_command(),
                "-m",
                "agentplatform.web",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.web_port),
                "--workers",
                "2",
                "--no-access-log",
            ],
        )
        for n in (1, 2):
            self._add(
                f"worker{n}",
                [
                    *celery,
                    "worker",
                    "-Q",
                    "agent,verify,events,webhooks",
                    "-c",
                    "2",
                    "--without-heartbeat",
                    "--without-gossip",
                    "--without-mingle",
                    "-n",
                    f"chaos{n}-{os.getpid()}@%h",
                    "--loglevel",
                    "INFO",
                ],
            )
        self._add("beat", self.beat_argv("beat"))
        for child in self.children.values():
            child.start()
        self.wait_ready()

    def beat_argv(self, name: str) -> list[str]:
        return [
            python_command(),
            "-m",
            "celery",
            "-A",
            "agentplatform",
            "beat",
            "--loglevel",
            "INFO",
            "--pidfile",
            str(self.root / f"{name}.pid"),
        ]

    def _add(self, name: str, argv: list[str]) -> Child:
        child = Child(
            name, argv, env=self.env, cwd=ROOT, log_dir=self.log_dir, pid_file=self.pid_file
        )
        self.children[name] = child
        return child

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [python_command(), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def wait_ready(self, timeout: float = 90) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        pending = {"worker1", "worker2", "web"}
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                child = self.children[name]
                child.check()
                if name == "web":
                    try:
                        if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                            pending.discard(name)
                    except httpx.HTTPError:
                        pass
                elif b"ready." in child.log_path.read_bytes():
                    pending.discard(name)
            time.sleep(0.2)
        if pending:
            raise RuntimeError(
                f"not ready after {timeout}s: {sorted(pending)} (logs {self.log_dir})"
            )

    def worker_ready_count(self, child: Child) -> int:
        return child.log_path.read_bytes().count(b"ready.")

    def restart_worker(self, name: str, timeout: float = 60) -> None:
        child = self.children[name]
        before = self.worker_ready_count(child)
        child.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.worker_ready_count(child) <= before:
            if not child.alive():
                break
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def supervise(self) -> None:
        for child in [*self.children.values(), *self.extra_beats]:
            child.check()

    def unexpected_exits(self) -> list[str]:
        return [
            exit_
            for child in [*self.children.values(), *self.extra_beats]
            for exit_ in child.unexpected_exits
        ]

    def stop(self) -> None:
        for child in [*self.extra_beats, *self.children.values()]:
            child.stop()
        for service in (self.redis, self.postgres):
            if service is not None:
                service.destroy()
        self.github.close()
        self.model.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.pid_file is not None:
            self.pid_file.remove()
        if not self.keep:
            remove_tree(self.root)


def short_fix_script(python: str = "python3") -> dict[str, Any]:
    """The scripted agent the load uses: fix add(), run the tests, finish."""
    return {
        "plan": "Fix add() in calc/core.py and run the tests.",
        "turns": [
            {
                "content": "add() subtracts; it must add.",
                "tool_calls": [
                    {
                        "name": "replace_text",
                        "arguments": {
                            "path": "calc/core.py",
                            "old": "return a - b",
                            "new": "return a + b",
                        },
                    }
                ],
            },
            {
                "content": "Running the tests.",
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": f"{python} -m unittest discover -s tests -q"},
                    }
                ],
            },
            {
                "content": "Done.",
                "tool_calls": [{"name": "finish", "arguments": {"summary": "add() fixed."}}],
            },
        ],
    }


def realistic_fix_script(python: str = "python3") -> dict[str, Any]:
    """A run as a model makes it, six requests: the plan, two reads (the code, its
    tests), the edit, the tests, finish."""
    short = short_fix_script(python)
    reads = [
        {
            "content": f"Reading {path} first.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": path}}],
        }
        for path in ("calc/core.py", "tests/test_core.py")
    ]
    return {**short, "turns": [*reads, *short["turns"]]}
