"""The processes of one host, as production runs them (docs/capacity.md).

``manage.py serve``, the realistic benchmark (``bench.inflight``) and the tests that
check the layout start them from here, so all three run what the docs describe:

- ``agent``: model turns, planning, judging, pull requests. A Celery **threads** pool of
  a few hundred threads: a run waiting on its model is a parked thread (about 1 MB),
  not a process. Its database connections come from one psycopg pool per process
  (``DATABASE_POOL``), and a step gives its connection back before each model wait
  (``runs.agent.waits``), so connections follow database work, not waiting runs.
- ``verify``: the repository's tests on the patch. A prefork pool, one process per core.
- ``events,webhooks`` (and the relay's queue): deliveries, consumers, webhook intake.
- every sandboxed command, from any of them, takes one of the host's CPU slots first
  (``runs.agent.slots``, ``SANDBOX_CPU_SLOTS``: one per core by default).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# Threads of the agent worker: runs a host keeps in flight. A parked thread costs about
# 1 MB of the worker's memory and nothing else; 200 on a 2-core host is the figure
# the benchmark measures (docs/capacity.md).
AGENT_THREADS = 200
# Web processes of a host (``python -m agentplatform.web --workers``): one serves several
# hundred submissions a second, and each holds up to WEB_THREADS + 2 connections.
WEB_PROCESSES = 1
# The agent worker's connection pool: a model wait gives its connection back, so this
# covers the steps doing database work and running commands at one moment.
AGENT_DATABASE_POOL = 8


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    queues: str
    pool: str
    concurrency: int
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, python: str, *, hostname: str = "%h") -> list[str]:
        return [
            python,
            "-m",
            "celery",
            "-A",
            "agentplatform",
            "worker",
            "-Q",
            self.queues,
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-n",
            f"{self.name}@{hostname}",
            # Liveness is the workers' own heartbeat rows (jobs.workers): Celery's
            # gossip, mingle and event heartbeats would only cost CPU.
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
        ]


def host_workers(
    *,
    agent_threads: int = AGENT_THREADS,
    verify_processes: int = 0,
    agent_database_pool: int = AGENT_DATABASE_POOL,
) -> list[WorkerSpec]:
    """The Celery workers of one host; ``verify_processes`` 0 means one per core."""
    cores = os.cpu_count() or 1
    return [
        WorkerSpec(
            "agent",
            "agent",
            "threads",
            agent_threads,
            env={
                "DATABASE_POOL": "true",
                "DATABASE_POOL_MIN_SIZE": "2",
                "DATABASE_POOL_MAX_SIZE": str(agent_database_pool),
            },
        ),
        WorkerSpec("verify", "verify", "prefork", verify_processes or cores),
        WorkerSpec("delivery", "events,webhooks", "prefork", 2),
    ]
