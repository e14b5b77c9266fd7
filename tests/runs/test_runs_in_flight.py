"""Runs in flight are bounded by work, not by processes: the host's layout
(agentplatform.layout) keeps many runs waiting on a slow model at once, with a small
connection pool and fewer CPU slots than waiting runs, and every run completes."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings

from agentplatform import layout
from runs.models import Run
from runs.services import task_submit
from runs.state import TERMINAL
from tests.chaos.modelserver import PROFILE, ScriptedModelServer
from tests.chaos.stack import realistic_fix_script
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    # Thirty runs of six model turns and a test suite each, on a shared 2-core machine.
    pytest.mark.timeout(900),
]

RUNS = 30
POOL = 5
SLOTS = 1
# Every model request takes this long: the runs spend most of their life waiting.
LATENCY = 1.0


class ConnectionsSeen:
    """The most PostgreSQL connections a worker held at once (pg_stat_activity, sampled)."""

    def __init__(self, application_name: str) -> None:
        db = django_settings.DATABASES["default"]
        self.connection = psycopg.connect(
            dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
        )
        self.application_name = application_name
        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.05):
            count = self.connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [self.application_name],
            ).fetchone()
            self.peak = max(self.peak, count[0] if count else 0)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.connection.close()


@pytest.fixture
def model():
    server = ScriptedModelServer(realistic_fix_script(), latency=LATENCY)
    yield server
    server.close()


def test_a_threads_worker_keeps_many_runs_waiting_with_few_connections_and_slots(
    workspace, repository, start_worker, model, settings, tmp_path: Path
):
    settings.MODEL_PROFILES = {PROFILE: model.profile()}
    workspace.max_active_runs = repository.max_active_runs = RUNS
    workspace.save()
    repository.save()
    application_name = f"agent-{uuid.uuid4().hex[:8]}"
    shared = {
        "MODEL_PROFILES": json.dumps({PROFILE: model.profile()}),
        "SANDBOX_CPU_SLOTS": str(SLOTS),
        "SANDBOX_CPU_SLOTS_DIR": str(tmp_path / "cpu-slots"),
        # Production's lease: the tests' 3 s one is for finding killed workers quickly,
        # and no beat runs here to hand on a lease that lapsed on a busy machine.
        "RUN_LEASE_SECONDS": "30",
        "RUN_STALL_SECONDS": "120",
    }
    agent, verify, _delivery = layout.host_workers(
        agent_threads=RUNS + 10, verify_processes=1, agent_database_pool=POOL
    )
    start_worker(
        "agent",
        queues=agent.queues,
        concurrency=agent.concurrency,
        pool=agent.pool,
        env={**shared, **agent.env, "DATABASE_APPLICATION_NAME": application_name},
    )
    start_worker("verify", queues=verify.queues, concurrency=verify.concurrency, env=shared)
    connections = ConnectionsSeen(application_name)
    try:
        runs = [
            task_submit(
                workspace=workspace,
                repository=repository,
                instruction=f"Fix add() ({n})",
                model_options={"profile": PROFILE},
            ).run
            for n in range(RUNS)
        ]
        wait_for(
            lambda: (
                not Run.objects.filter(pk__in=[r.pk for r in runs])
                .exclude(status__in=TERMINAL)
                .exists()
            ),
            timeout=600,
            interval=0.5,
            message="every run to end",
        )
    finally:
        connections.stop()

    ended = list(
        Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", "failure_reason")
    )
    assert len(ended) == RUNS
    # All completed: none cancelled, none failed by a fault of the infrastructure.
    assert set(ended) == {(Run.Status.COMPLETED, "")}, ended
    # Six requests per run, each answered once.
    assert len(model.requests()) == 6 * RUNS
    # Far more runs waited on the model at once than the host has CPU slots or the worker
    # has connections: a wait holds neither.
    assert model.peak >= 10 > POOL > SLOTS, model.peak
    assert 0 < connections.peak <= POOL, connections.peak
