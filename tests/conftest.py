"""Shared fixtures: real services, real worker processes, a generated git repository."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agentplatform import embedded, prerequisites, supervision
from runs import demo
from runs.management.process_groups import process_groups_stop
from tests.chaos.services import live_processes

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIR = ROOT / "test-output"


def _reachable(url: str, default_port: int) -> bool:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=2
        ):
            return True
    except OSError:
        return False


def _services_missing() -> str | None:
    """Why PostgreSQL or Redis cannot be reached (the configured servers, or the embedded
    ones that did not start: tests/settings.py), or None."""
    missing = [
        name
        for name, url, port in (
            ("PostgreSQL", os.environ["DATABASE_URL"], 5432),
            ("Redis", os.environ["REDIS_URL"], 6379),
        )
        if not _reachable(url, port)
    ]
    if not missing:
        return None
    message = f"{' and '.join(missing)} unreachable"
    error = os.environ.get("EMBEDDED_SERVICES_ERROR")
    if error:
        message += f" (the embedded services did not start: {error})"
    return message


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under REQUIRE_SERVICES=1 a missing program or service ends the run at once, in one
    clear message, before any test process starts (an error raised later, inside an xdist
    worker, would end as the controller's INTERNALERROR)."""
    if os.environ.get("REQUIRE_SERVICES") != "1" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    missing = prerequisites.missing_programs("test")
    if missing:
        pytest.exit(prerequisites.report(missing, "test"), returncode=4)
    unreachable = _services_missing()
    if unreachable:
        pytest.exit(f"{unreachable}, and REQUIRE_SERVICES=1 makes that an error", returncode=4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip service tests when PostgreSQL or Redis is down (REQUIRE_SERVICES=1 never gets
    here with them down: see pytest_sessionstart)."""
    message = _services_missing()
    if message is None:
        return
    skip = pytest.mark.skip(reason=message)
    for item in items:
        if "no_services" not in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _throttle_counts_fresh(request: pytest.FixtureRequest) -> None:
    """Each test starts with no API request counted against a rate limit: the counts live
    in Redis, which outlives a test (and a test run)."""
    if request.node.get_closest_marker("no_services"):
        return
    from agentplatform.api.throttling import limiter

    limiter().storage.reset()
    request.getfixturevalue("_access_listener_stopped_at_end")


@pytest.fixture(scope="session")
def _access_listener_stopped_at_end(django_db_setup: Any) -> Iterator[None]:
    """The API's access cache listens on a connection of its own to the test database;
    it is closed before that database is dropped (set up after it, torn down before)."""
    yield
    from agentplatform.api.access_cache import listener_stop

    listener_stop()


@pytest.fixture
def embedded_var() -> Iterator[Path]:
    """A var directory for embedded services of the test's own, stopped and removed at
    teardown. Not under pytest's tmp_path: pytest makes its base directory private again
    (0700) whenever another session starts, and the servers' unprivileged account would
    lose its way to the data directories mid-test."""
    path = Path(tempfile.mkdtemp(prefix="agentplatform-embedded-"))
    path.chmod(0o711)
    try:
        yield path / "var"
    finally:
        embedded.stop(path / "var")
        shutil.rmtree(path, ignore_errors=True)


# --- repositories ---------------------------------------------------------------------------


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    """A bare git repository whose main branch has a failing test."""
    return demo.sample_repository_create(tmp_path / "origin")


@pytest.fixture
def workspace(db: Any) -> Any:
    from tests.factories import WorkspaceFactory

    return WorkspaceFactory()


@pytest.fixture
def repository(workspace: Any, sample_repo: Path) -> Any:
    from tests.factories import RepositoryFactory

    return RepositoryFactory(workspace=workspace, clone_url=str(sample_repo))


@pytest.fixture
def submitter(db: Any) -> tuple[Any, Any]:
    """An API client authenticated as a member of a workspace, and a repository of it
    (both allowing 100 active runs)."""
    from rest_framework.test import APIClient

    from runs.models import Membership
    from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

    workspace = WorkspaceFactory(max_active_runs=100)
    repository = RepositoryFactory(workspace=workspace, max_active_runs=100)
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    api = APIClient()
    api.force_authenticate(user)
    return api, repository


@pytest.fixture
def run(repository: Any) -> Any:
    """A queued run (run 1) of a task on ``repository``, no message sent."""
    from runs.models import Run
    from tests.factories import TaskFactory

    task = TaskFactory(workspace=repository.workspace, repository=repository)
    return Run.objects.create(task=task, run_no=1)


def database_backend_terminate() -> None:
    """Terminate this thread's PostgreSQL backend from another connection, as a database
    restart or failover does: the next statement on it fails."""
    import psycopg
    from django.db import connection

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    db = settings.DATABASES["default"]
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


# --- worker processes -------------------------------------------------------------------------


class WorkerProcess:
    """A real Celery worker (prefork unless told) in its own process group, on the test
    database."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        queues: str,
        concurrency: int,
        env: dict[str, str] | None = None,
        pool: str = "prefork",
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        db = settings.DATABASES["default"]
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": (f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"),
            "AGENTPLATFORM_VAR_DIR": str(settings.VAR_DIR),
            "SANDBOX_ROOT": str(settings.SANDBOX_ROOT),
            **(env or {}),
        }
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = supervision.spawn(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agentplatform",
                "worker",
                "-Q",
                queues,
                "-c",
                str(concurrency),
                "-P",
                pool,
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
                "-n",
                f"{name}-{os.getpid()}@%h",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> None:
        # A worker imports Django, Celery and the agent's libraries: seconds on a quiet
        # machine, most of a minute on a loaded one. A patience, not a timing assertion.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-3000:]}")
            if b"ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole worker (parent and children): no cleanup, no ack."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        process_groups_stop([self.process], timeout=15)
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes; all are stopped at teardown. Purges queues first."""
    from agentplatform.celery import app
    from jobs.relay import relay_wake_reset
    from jobs.work import work_wake_reset

    app.control.purge()
    relay_wake_reset()
    work_wake_reset()
    workers: list[WorkerProcess] = []

    def start(
        name: str = "w",
        queues: str = "agent,verify,events,webhooks",
        concurrency: int = 2,
        env: dict[str, str] | None = None,
        pool: str = "prefork",
    ) -> WorkerProcess:
        worker = WorkerProcess(name, tmp_path, queues, concurrency, env, pool)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
    app.control.purge()
    relay_wake_reset()
    work_wake_reset()


def beat_start(schedule: Path, log: Any) -> subprocess.Popen[bytes]:
    """A real ``celery beat`` on the test database, in its own process group."""
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    return supervision.spawn(
        [
            *(sys.executable, "-m", "celery", "-A", "agentplatform", "beat"),
            *("--loglevel", "INFO", "--pidfile=", "-s", str(schedule)),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@contextmanager
def web_server(**env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The real uvicorn serving ``agentplatform.asgi`` on the test database.

    Yields its base URL and process once ``/healthz`` answers; ``env`` adds settings.
    """
    db = settings.DATABASES["default"]
    port = free_port()
    process = supervision.spawn(
        [sys.executable, "-m", "uvicorn", "agentplatform.asgi:application", "--port", str(port)],
        cwd=Path(__file__).resolve().parent.parent,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=30):  # noqa: S310
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def processes_with(token: str) -> list[int]:
    """Host pids of live processes whose command line holds ``token``."""
    return [pid for pid, _, cmdline in live_processes() if token.encode() in cmdline]


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60,
    interval: float = 0.1,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


# --- a Redis of the test's own (never restart the shared one) --------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRedis:
    """A Redis server (the embedded Valkey's binary) on a free port without persistence:
    a restart loses every message."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.process = supervision.spawn(
            [
                str(embedded.valkey_server()),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _reachable(self.url, self.port), timeout=10, message="own redis up")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, down_seconds: float = 1.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


class SilentServer:
    """A TCP server that takes connections and what is written on them, and never
    answers: a Redis that hangs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.received = bytearray()
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        while chunk := connection.recv(65536):
            self.received += chunk

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def broker_at() -> Iterator[Callable[[str | None], None]]:
    """Point this process's Celery app at another broker URL (restored at teardown)."""
    from agentplatform.celery import app

    original = app.conf.broker_write_url

    def point(url: str | None) -> None:
        app.conf.broker_write_url = url
        # The connection and producer pools were built for the old URL.
        app._pool = None
        app.amqp._producer_pool = None

    yield point
    point(original)


def queue_lists(queue: str) -> list[str]:
    """The Redis lists of a queue: kombu keeps one per priority step (runs.priorities)."""
    return [queue, *(f"{queue}\x06\x16{step}" for step in range(1, 10))]
