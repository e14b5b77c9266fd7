"""An infrastructure fault never ends a run: only a recorded cancellation request does.

A PostgreSQL restart (on a server of the test's own) while the runs wait on the model,
longer than a lease, loses no run and cancels none either.

Several runs are in flight on a real threads worker against a slow local model server
(Chat Completions over HTTP) whose agent runs a slow test command. The worker logs in as
a role with a ``CONNECTION LIMIT``. The test fills every slot the role has left and ends
the connection the worker's heartbeat renews leases on, so the heartbeat is refused
("too many connections for role") for longer than a lease while the step threads keep
the connections they hold; then it gives the slots back. A step whose lease became
uncertain stops its command and writes nothing; the reaper hands its run on. Every run
must complete and none may end cancelled.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection

from runs.models import Run
from runs.reaper import zombies_reap
from runs.services import task_submit
from runs.state import TERMINAL
from tests.chaos.modelserver import ScriptedModelServer
from tests.chaos.services import PostgresCluster, remove_tree
from tests.chaos.stack import short_fix_script
from tests.conftest import ROOT, wait_for
from tests.factories import RepositoryFactory, WorkspaceFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.services]

PROFILE = "slow-model"
RUNS = 4
LIMIT = 10
MODEL_SECONDS = 1.0
# The agent's test command outlasts a lease (tests run with RUN_LEASE_SECONDS=3).
COMMAND = "python3 -c 'import time; time.sleep(12)' && python3 -m unittest discover -s tests -q"


class SlowModelServer(ScriptedModelServer):
    """The scripted agent, answering every request after ``MODEL_SECONDS``."""

    def reply(self, body: dict[str, Any], position: str) -> dict[str, Any]:
        time.sleep(MODEL_SECONDS)
        return super().reply(body, position)


def _script(*, commands: int = 1) -> dict[str, Any]:
    """The short fix, its test command slow; with ``commands`` 2, run twice (two turns)."""
    script = short_fix_script()
    for turn in script["turns"]:
        for call in turn.get("tool_calls", []):
            if call["name"] == "run_command":
                call["arguments"]["command"] = COMMAND
    if commands == 2:
        script["turns"].insert(2, copy.deepcopy(script["turns"][1]))
    return script


@pytest.fixture
def model() -> Iterator[SlowModelServer]:
    server = SlowModelServer(_script())
    yield server
    server.close()


@pytest.fixture
def model_two_commands() -> Iterator[SlowModelServer]:
    server = SlowModelServer(_script(commands=2))
    yield server
    server.close()


def _admin() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    )


@pytest.fixture
def scarce_role() -> Iterator[str]:
    """A login role allowed ``LIMIT`` connections, with the rights the worker needs."""
    name = f"{settings.DATABASES['default']['NAME']}_few"[:60]
    with _admin() as admin:
        with contextlib.suppress(psycopg.Error):
            admin.execute(f'DROP OWNED BY "{name}"')
        admin.execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {LIMIT}')
        admin.execute(f'GRANT ALL ON SCHEMA public TO "{name}"')
        admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{name}"')
        admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{name}"')
    yield name
    with _admin() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name]
        )
        admin.execute(f'DROP OWNED BY "{name}"')
        admin.execute(f'DROP ROLE "{name}"')


def _starve_heartbeat(role: str, seconds: float) -> None:
    """For ``seconds``, hold every slot the role has left and end each connection the
    worker renews leases on (whose last statement is the heartbeat's), taking its slot.

    The step threads keep the connections they hold: the shortage meets whoever needs a
    new one, as when a pool of threads outgrows ``max_connections``."""
    db = settings.DATABASES["default"]
    held: list[psycopg.Connection] = []

    def fill() -> None:
        while True:
            try:
                held.append(
                    psycopg.connect(
                        dbname=db["NAME"],
                        user=role,
                        host=db["HOST"],
                        port=db["PORT"],
                        autocommit=True,
                    )
                )
            except psycopg.OperationalError as error:
                assert "too many connections" in str(error), error
                return

    deadline = time.monotonic() + seconds
    with _admin() as admin:
        fill()
        while time.monotonic() < deadline:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s "
                "AND query LIKE %s AND NOT pid = ANY(%s)",
                [
                    role,
                    'UPDATE "runs_run" AS r SET lease_until = %',
                    [c.info.backend_pid for c in held],
                ],
            )
            fill()  # at once: the heartbeat reconnects on its next beat
            time.sleep(0.02)
    for conn in held:
        conn.close()


def test_a_connection_shortage_cancels_no_run(
    workspace, repository, start_worker, scarce_role, model, settings
):
    settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, PROFILE: model.profile()}
    db = settings.DATABASES["default"]
    worker = start_worker(
        pool="threads",
        concurrency=RUNS,
        env={
            "DATABASE_URL": f"postgres://{scarce_role}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "MODEL_PROFILES": json.dumps({PROFILE: model.profile()}),
        },
    )
    workspace.max_active_runs = repository.max_active_runs = RUNS
    workspace.save()
    repository.save()
    runs = [
        task_submit(
            workspace=workspace,
            repository=repository,
            instruction=f"Fix add() ({n})",
            model_options={"profile": PROFILE},
        ).run
        for n in range(RUNS)
    ]
    ids = [run.pk for run in runs]

    def in_command() -> bool:
        # Every run has asked for its test command (the agent's second act turn).
        return sum(1 for r in model.requests() if r.position == "act-1") >= RUNS

    wait_for(in_command, timeout=120, message="runs to reach their test command")
    time.sleep(MODEL_SECONDS + 0.5)
    _starve_heartbeat(scarce_role, settings.RUN_LEASE_SECONDS + 2.0)  # longer than a lease

    def ended() -> list[Run] | None:
        zombies_reap()
        current = list(Run.objects.filter(pk__in=ids))
        return current if all(r.status in TERMINAL for r in current) else None

    final = wait_for(ended, timeout=240, message="every run to end")
    outcomes = sorted((r.status, r.failure_reason) for r in final)
    assert outcomes == [(Run.Status.COMPLETED, "")] * RUNS, outcomes
    assert not Run.objects.filter(pk__in=ids, status=Run.Status.CANCELLED).exists()
    # The shortage was real: the worker was refused for the role's limit.
    assert "too many connections for role" in worker.output()
    connection.close()


def test_connection_shortages_at_two_points_of_a_run_do_not_spend_its_recoveries(
    workspace, repository, start_worker, scarce_role, model_two_commands, settings
):
    """A recovery after which the run moved on is not counted against it: with one
    recovery allowed at a point, two shortages at two points of every run (its first
    and its second test command) end none of them (docs/design.md, Decisions:
    "Recoveries count where the step crashed")."""
    model = model_two_commands
    settings.RUN_MAX_RECOVERIES = 1
    settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, PROFILE: model.profile()}
    db = settings.DATABASES["default"]
    worker = start_worker(
        pool="threads",
        concurrency=RUNS,
        env={
            "DATABASE_URL": f"postgres://{scarce_role}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "MODEL_PROFILES": json.dumps({PROFILE: model.profile()}),
        },
    )
    workspace.max_active_runs = repository.max_active_runs = RUNS
    workspace.save()
    repository.save()
    ids = [
        task_submit(
            workspace=workspace,
            repository=repository,
            instruction=f"Fix add() ({n})",
            model_options={"profile": PROFILE},
        ).run.pk
        for n in range(RUNS)
    ]

    def recovered(times: int) -> bool:
        zombies_reap()
        return all(r.recoveries >= times for r in Run.objects.filter(pk__in=ids))

    for times, position in ((1, "act-1"), (2, "act-2")):
        # Every run has asked for this test command, and runs it.
        wait_for(
            lambda position=position: (
                sum(1 for r in model.requests() if r.position == position) >= RUNS
            ),
            timeout=180,
            message=f"runs to reach their command of {position}",
        )
        time.sleep(MODEL_SECONDS + 0.5)
        _starve_heartbeat(scarce_role, settings.RUN_LEASE_SECONDS + 2.0)
        wait_for(lambda times=times: recovered(times), timeout=60, message="the recoveries")

    def ended() -> list[Run] | None:
        zombies_reap()
        current = list(Run.objects.filter(pk__in=ids))
        return current if all(r.status in TERMINAL for r in current) else None

    final = wait_for(ended, timeout=240, message="every run to end")
    outcomes = sorted((r.status, r.failure_reason) for r in final)
    assert outcomes == [(Run.Status.COMPLETED, "")] * RUNS, outcomes
    assert all(r.recoveries == 2 for r in final), [r.recoveries for r in final]
    assert "too many connections for role" in worker.output()
    connection.close()


@pytest.fixture
def own_database(transactional_db: Any) -> Iterator[PostgresCluster]:
    """A PostgreSQL of the test's own, migrated as the test database is; this process's
    connection points at it until the end of the test."""
    # Outside pytest's directory, which the server's unprivileged account cannot enter.
    root = Path(tempfile.mkdtemp(prefix="faults-pg-"))
    cluster = PostgresCluster(root)
    try:
        cluster.create_database("chaos")
        migrated = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": cluster.url,
            },
            capture_output=True,
        )
        assert migrated.returncode == 0, migrated.stderr.decode()[-2000:]
    except BaseException:
        cluster.destroy()
        remove_tree(root)
        raise
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=cluster.port, NAME="chaos")
    try:
        yield cluster
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        cluster.destroy()
        remove_tree(root)


def test_a_postgres_restart_during_model_waits_loses_and_cancels_no_run(
    own_database, start_worker, settings, sample_repo
):
    # Created on the test's own server (own_database comes first).
    workspace = WorkspaceFactory(max_active_runs=RUNS)
    repository = RepositoryFactory(
        workspace=workspace, clone_url=str(sample_repo), max_active_runs=RUNS
    )
    server = SlowModelServer(short_fix_script())
    try:
        settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, PROFILE: server.profile()}
        start_worker(
            pool="threads",
            concurrency=RUNS,
            env={
                "DATABASE_URL": own_database.url,
                "MODEL_PROFILES": json.dumps({PROFILE: server.profile()}),
            },
        )
        ids = [
            task_submit(
                workspace=workspace,
                repository=repository,
                instruction=f"Fix add() ({n})",
                model_options={"profile": PROFILE},
            ).run.pk
            for n in range(RUNS)
        ]
        # Every run is waiting on its first act turn's answer.
        wait_for(
            lambda: sum(1 for r in server.requests() if r.position == "act-0") >= RUNS,
            timeout=120,
            message="runs to wait on the model",
        )
        connection.close()
        own_database.stop()
        time.sleep(settings.RUN_LEASE_SECONDS + 2.0)  # longer than a lease
        own_database.start()

        def ended() -> list[Run] | None:
            try:
                zombies_reap()
                current = list(Run.objects.filter(pk__in=ids))
            except DatabaseError:
                connection.close()
                return None
            return current if all(r.status in TERMINAL for r in current) else None

        final = wait_for(ended, timeout=240, message="every run to end")
    finally:
        server.close()
    outcomes = sorted((r.status, r.failure_reason) for r in final)
    assert outcomes == [(Run.Status.COMPLETED, "")] * RUNS, outcomes
