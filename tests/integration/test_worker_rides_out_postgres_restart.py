"""A worker keeps running across a restart of its PostgreSQL (an instance of the test's
own, on its own port) and does its work afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from agentplatform import embedded
from tests.conftest import free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The embedded default's server binaries: no system PostgreSQL needed.
BIN = embedded.postgres_bin()


class OwnPostgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="h11-pg-"))
        self.port = free_port()
        # initdb refuses to run as root: as root, the server runs as the account the
        # embedded servers run as.
        self.as_root = os.geteuid() == 0
        if self.as_root:
            embedded.service_account()  # created on first use
            shutil.chown(self.dir, embedded.SERVICE_ACCOUNT, embedded.SERVICE_ACCOUNT)
        self._as_postgres(
            str(BIN / "initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "-A", "trust"
        )

    def _as_postgres(self, *command: str) -> None:
        prefix = ["runuser", "-u", embedded.SERVICE_ACCOUNT, "--"] if self.as_root else []
        subprocess.run(
            [*prefix, *command],
            check=True,
            capture_output=True,
            cwd=self.dir,
        )

    def pg_ctl(self, action: str) -> None:
        self._as_postgres(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.dir / "data"),
            "-w",
            "-l",
            str(self.dir / "log"),
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
            "-m",
            "fast",
            action,
        )

    def url(self, name: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg_ctl("stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    if not (BIN / "initdb").exists() or (os.geteuid() == 0 and not shutil.which("runuser")):
        pytest.skip("the PostgreSQL server binaries or runuser are missing")
    server = OwnPostgres()
    server.pg_ctl("start")
    yield server
    server.remove()


def test_worker_survives_a_postgres_restart(own_postgres, tmp_path):
    # The schema of the test database, copied into the test's own server.
    db = settings.DATABASES["default"]
    schema = subprocess.run(
        [
            str(BIN / "pg_dump"),
            "-s",
            "-O",
            "-x",
            "-h",
            db["HOST"],
            "-p",
            str(db["PORT"]),
            "-U",
            db["USER"],
            db["NAME"],
        ],
        check=True,
        capture_output=True,
    ).stdout
    with psycopg.connect(own_postgres.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE agent")
    subprocess.run(
        [str(BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", own_postgres.url("agent")],
        input=schema,
        check=True,
        capture_output=True,
    )

    def item(key: str) -> int:
        with psycopg.connect(own_postgres.url("agent"), autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO jobs_workitem (kind, key, args, queue, status, due_at, wakes,"
                " attempts, crashes, last_error, claim, traceparent, created_at)"
                " VALUES ('dead_letter.requeue', %s, '{\"letter_id\": "
                "\"00000000-0000-0000-0000-000000000000\"}', 'events', 'pending', now(), 0,"
                " 0, 0, '', '', '', now()) RETURNING id",
                [key],
            ).fetchone()
            return int(row[0])

    def attempts(pk: int) -> int:
        with psycopg.connect(own_postgres.url("agent"), autocommit=True) as conn:
            row = conn.execute("SELECT attempts FROM jobs_workitem WHERE id = %s", [pk]).fetchone()
            return int(row[0])

    from agentplatform.celery import app
    from tests.conftest import ROOT

    queue = f"h11-pg-{own_postgres.port}"
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentplatform",
            "worker",
            "-Q",
            queue,
            "-c",
            "1",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{queue}@%h",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": own_postgres.url("agent"),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        before = item("before")
        app.send_task("jobs.work", args=[before], queue=queue)
        # The letter does not exist: the item fails and is retried later, which is
        # enough to show the worker used its database.
        try:
            wait_for(lambda: attempts(before) >= 1, timeout=30, message="work before the restart")
        except AssertionError:
            raise AssertionError((tmp_path / "worker.log").read_text()[-3000:]) from None

        own_postgres.pg_ctl("restart")

        after = item("after")
        app.send_task("jobs.work", args=[after], queue=queue)
        wait_for(lambda: attempts(after) >= 1, timeout=60, message="work after the restart")
        assert worker.poll() is None
    finally:
        # Whatever failed, the worker does not outlive the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()
    assert "Unrecoverable error" not in (tmp_path / "worker.log").read_text()
