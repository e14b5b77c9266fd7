"""The benchmark's harness: its database, broker and worker processes, and the
runs and no-op tasks the figures time."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from agentplatform import embedded
from bench.environment import (
    PY,
    Processes,
    bench_environment,
    broker_queue_keys,
    database_recreate,
    free_port,
    redis_ping,
    wait_for,
)
from bench.table import Table, say


class Bench:
    """The services, processes and runs every figure shares; ``bench.figures`` measure."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.reps = args.reps
        self.table = Table()
        self.env = bench_environment()
        self.logdir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
        self.procs = Processes(self.env, self.logdir)
        self.tiny = args.tiny
        self.own_redis = False
        os.environ.update(self.env)

    def redis_start(self) -> None:
        """A Redis of our own (broker, stream, coalescing keys): nobody else purges it."""
        import shutil

        server = shutil.which("redis-server") or str(embedded.valkey_server())
        if self.args.shared_redis or server is None:
            return
        port = free_port()
        self.procs.start(
            "redis",
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        url = f"redis://127.0.0.1:{port}/0"
        wait_for(lambda: redis_ping(url), 10, "redis-server")
        self.own_redis = True
        for key in ("REDIS_URL", "CELERY_BROKER_URL", "EVENT_STREAM_REDIS_URL"):
            self.env[key] = url
        os.environ.update(self.env)
        self.procs.env = self.env

    def setup(self) -> None:
        self.redis_start()
        say(
            f"database {self.env['BENCH_DATABASE']} (re-created), broker "
            f"{self.env['CELERY_BROKER_URL']}; logs in {self.logdir}"
        )
        database_recreate(self.env)
        import django

        django.setup()
        import logging

        # The processes under test log as configured; this one only reports.
        logging.getLogger().setLevel(logging.WARNING)
        for name in ("agentplatform", "celery", "django"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS bench_insert "
                "(id bigserial PRIMARY KEY, body text, created timestamptz DEFAULT now())"
            )
        import redis

        self.redis = redis.Redis.from_url(self.env["REDIS_URL"])
        self.broker = redis.Redis.from_url(self.env["CELERY_BROKER_URL"])
        self.broker_purge()
        from runs.models import Repository, Workspace

        # A daily budget that is never reached: admission (figure 6) checks it as well.
        self.workspace = Workspace.objects.create(
            slug="bench",
            name="bench",
            max_active_runs=1_000_000,
            daily_cost_budget_usd=1_000_000,
        )
        self.repository = Repository.objects.create(
            workspace=self.workspace,
            name="bench",
            clone_url="/dev/null",
            max_active_runs=1_000_000,
        )

    def broker_purge(self) -> None:
        """Every message queued or unacknowledged, and the relay's coalescing flags."""
        from jobs.relay import RELAY_PENDING_KEY, RELAY_SCHEDULED_KEY

        if self.own_redis:
            # The benchmark's own redis-server: nothing in it outlives a figure.
            self.broker.flushdb()
            return
        self.broker.delete(
            *broker_queue_keys(extra=["rawbench"]),
            "unacked",
            "unacked_index",
            RELAY_PENDING_KEY,
            RELAY_SCHEDULED_KEY,
        )
        self.redis.delete("bench:tasks", "bench:raw:done", "bench:raw:latency")
        from jobs.work import work_wake_reset

        work_wake_reset()

    def quiesce(self) -> None:
        """Start a figure from an empty broker and no work left by the figures before it.

        What a figure leaves behind (webhook deliveries and consumer work not processed,
        outbox rows not published, runs and deferred tasks nobody will step) would be
        picked up by the next figure's workers and beat sweeps and counted as its cost:
        the idle figure after the web figures measured their backlog. It is marked done
        in the database, and the broker emptied.
        """
        from django.db import transaction
        from django.utils import timezone

        from jobs.models import OutboxEvent, WorkItem
        from runs.models import Run, Task
        from runs.state import TERMINAL

        now = timezone.now()
        with transaction.atomic():
            cleared = {
                "runs": Run.objects.exclude(status__in=TERMINAL).update(
                    status=Run.Status.CANCELLED, lease_owner="", lease_until=None, finished_at=now
                ),
                "deferred tasks": Task.objects.filter(status=Task.Status.DEFERRED).update(
                    status=Task.Status.CANCELLED
                ),
                "work items": WorkItem.objects.filter(status=WorkItem.Status.PENDING).update(
                    status=WorkItem.Status.DONE, finished_at=now
                ),
                "outbox rows": OutboxEvent.objects.filter(published_at__isnull=True).update(
                    published_at=now
                ),
            }
        self.broker_purge()
        left = {name: count for name, count in cleared.items() if count}
        if left:
            say(f"quiesce: marked done what earlier figures left: {left}")

    def database_settle(self) -> None:
        """Vacuum and analyse the database, as autovacuum would have done by the time the
        next figure starts. It is off on machines like this one (on by default in
        PostgreSQL): the dead rows of every earlier figure stayed, and no table was ever
        analysed, so each figure planned and read against what the ones before it left.
        """
        from django.db import DatabaseError, connection

        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")
            # What was written in the last minutes PostgreSQL writes back to its files in
            # a checkpoint paced over the next minutes (most of 5 by default), its writes
            # and fsyncs sharing the disk with the commits timed next. One 1,000,000-run
            # fill left lease acquisition 1.7x slower while that checkpoint ran. Flushed
            # here, before any timing.
            try:
                cursor.execute("CHECKPOINT")
            except DatabaseError as error:  # needs superuser or pg_checkpoint
                say(f"CHECKPOINT refused ({error}); earlier writes may overlap timing")

    def teardown(self) -> None:
        self.procs.stop_all()

    def worker(self, concurrency: int, name: str = "worker", beat: bool = False) -> list[Any]:
        log = self.logdir / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        child = self.procs.start(
            name,
            [
                PY,
                "-m",
                "celery",
                "-A",
                "bench.app",
                "worker",
                "-Q",
                "agent,verify,events,webhooks",
                "-c",
                str(concurrency),
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
                "-n",
                f"{name}-{os.getpid()}@%h",
            ],
        )

        def ready() -> bool:
            if child.poll() is not None:
                raise RuntimeError(f"{name} exited; see {log}")
            return b" ready." in log.read_bytes()[offset:]

        wait_for(ready, 60, f"{name} ready", every=0.2)
        started = [child]
        if beat:
            started.append(
                self.procs.start(
                    f"{name}-beat",
                    [
                        PY,
                        "-m",
                        "celery",
                        "-A",
                        "bench.app",
                        "beat",
                        "--loglevel",
                        "WARNING",
                        "-s",
                        str(self.logdir / "beat-schedule"),
                    ],
                )
            )
        return started

    def raw_worker(self, concurrency: int) -> Any:
        log = self.logdir / "raw-worker.log"
        offset = log.stat().st_size if log.exists() else 0
        child = self.procs.start(
            "raw-worker",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "bench.rawapp",
                "worker",
                "-Q",
                "rawbench",
                "-c",
                str(concurrency),
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
                "-n",
                f"raw-{os.getpid()}@%h",
            ],
        )
        wait_for(lambda: b" ready." in log.read_bytes()[offset:], 60, "raw worker", every=0.2)
        return child

    def sessions(self) -> int:
        """Connections ever opened to the bench database (pg_stat_database.sessions)."""
        import psycopg

        with psycopg.connect(self.env["BENCH_ADMIN_URL"], autocommit=True) as conn:
            row = conn.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = %s",
                [self.env["BENCH_DATABASE"]],
            ).fetchone()
        # This probe's own session is to another database: it is not counted.
        return int(row[0]) if row else 0

    def tasks_counted(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall("bench:tasks").items()}

    def submit(self, n: int) -> list[Any]:
        from runs.services import task_submit

        return [
            task_submit(
                workspace=self.workspace, repository=self.repository, instruction="bench"
            ).run.id
            for _ in range(n)
        ]

    def wait_terminal(self, run_ids: list[Any], timeout: float = 300) -> None:
        from runs.models import Run
        from runs.state import TERMINAL

        def done() -> bool:
            return Run.objects.filter(pk__in=run_ids).exclude(status__in=TERMINAL).count() == 0

        wait_for(done, timeout, f"{len(run_ids)} runs to finish", every=0.05)

    def steps_rep(self, runs: int) -> tuple[float, dict[str, float]]:
        """Submit ``runs`` runs at once; steps/s until the last finished, and what it cost."""
        from django.db.models import Max, Sum

        from runs.models import Run

        self.redis.delete("bench:tasks")
        sessions = self.sessions()
        started = time.time()
        ids = self.submit(runs)
        self.wait_terminal(ids)
        agg = Run.objects.filter(pk__in=ids).aggregate(
            steps=Sum("step_no"), last=Max("finished_at")
        )
        elapsed = agg["last"].timestamp() - started
        statuses = set(Run.objects.filter(pk__in=ids).values_list("status", flat=True))
        if statuses != {"completed"}:
            raise RuntimeError(f"bench runs ended {statuses}")
        # Backlog: how long after the last commit until the events queue and outbox drain.
        from jobs.models import OutboxEvent

        backlog_at_end = self.broker.llen("events")
        wait_for(
            lambda: (
                self.broker.llen("events") == 0
                and not OutboxEvent.objects.filter(published_at__isnull=True).exists()
            ),
            120,
            "event backlog to drain",
            every=0.02,
        )
        drained = time.time() - agg["last"].timestamp()
        time.sleep(0.3)  # let the last consumers finish before counting
        counted = self.tasks_counted()
        steps = agg["steps"]
        return steps / elapsed, {
            "steps": steps,
            "relay_per_run": counted.get("jobs.outbox_relay", 0) / runs,
            "consume_per_run": counted.get("jobs.work", 0) / runs,
            "connections_per_step": (self.sessions() - sessions) / steps,
            "backlog_at_end": backlog_at_end,
            "drain_seconds": drained,
        }

    def raw_rep(self, tasks: int) -> float:
        from bench.rawapp import noop

        self.redis.set("bench:raw:done", 0)
        started = time.time()
        with noop.app.producer_or_acquire() as producer:
            for _ in range(tasks):
                noop.apply_async(producer=producer)
        wait_for(lambda: int(self.redis.get("bench:raw:done") or 0) >= tasks, 300, "raw tasks")
        return tasks / (time.time() - started)

    def m_steps_minimal(self) -> None:
        worker = self.worker(2, name="fill-worker")
        self.wait_terminal(self.submit(1))
        for child in worker:
            self.procs.stop(child)

    def backend_pids(self) -> list[int]:
        """PostgreSQL backends serving the bench database (their CPU is ours)."""
        import psycopg

        with psycopg.connect(self.env["BENCH_ADMIN_URL"], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s",
                [self.env["BENCH_DATABASE"]],
            ).fetchall()
        return [pid for (pid,) in rows]
