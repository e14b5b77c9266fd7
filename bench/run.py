"""``make bench``: the platform against its baselines, measured side by side, one table.

Every figure is a ratio against a baseline measured in the same run on the same services
(PostgreSQL of DATABASE_URL, Redis of REDIS_URL / CELERY_BROKER_URL), because absolute
figures on a shared machine are noise; each is the median of ``--reps`` repetitions with
min and max. The benchmark uses its own database (``<DATABASE_URL name>_bench``, dropped
and re-created) and starts and stops its own worker and web processes.

    .venv/bin/python -m bench.run                 # everything, default sizes
    .venv/bin/python -m bench.run --only wake,relay --reps 5
    .venv/bin/python -m bench.run --tiny          # seconds: the smoke test's sizes
    .venv/bin/python -m bench.run --only compare --against HEAD~1   # figures 4, 5 of both
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

from agentplatform import embedded, supervision
from bench import inflight
from runs.management.process_groups import process_groups_stop

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GITHUB_SECRET = "bench-webhook-secret"
MEASUREMENTS = [
    "steps",
    "wake",
    "relay",
    "web",
    "scale",
    "idle",
    "e2e",
    "capacity",
    "fairness",
    "inflight",
]


# --- figures and the table -----------------------------------------------------------------


@dataclass
class Figure:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    baseline_name: str = ""
    target: str = ""

    def med(self, xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    def ratio(self) -> float:
        """The median over the baseline's median (NaN without a baseline)."""
        v, b = self.med(self.values), self.med(self.baseline)
        return v / b if self.baseline and b and v == v else float("nan")

    def met(self) -> bool | None:
        """Whether the figure meets its target, judged on the unrounded figures (a ratio
        of 0.396 printed as 0.40 does not meet ``>= 0.4``); None without a target or a
        measurement. A target without a unit, or in ``x``, bounds the ratio when the
        figure has a baseline; any other bounds the median: ``< 20 ms``, ``<= 3``, ``0``
        (exactly), ``~0`` (within 0.01)."""
        match = _TARGET.match(self.target)
        if match is None:
            return None
        op, bound, unit = match.group(1) or "==", float(match.group(2)), match.group(3) or ""
        on_ratio = bool(self.baseline) and unit in ("", "x")
        x = self.ratio() if on_ratio else self.med(self.values)
        if x != x:
            return None
        return {
            ">=": x >= bound,
            "<=": x <= bound,
            ">": x > bound,
            "<": x < bound,
            "==": x == bound,
            "~": abs(x - bound) < 0.01,
        }[op]

    def row(self) -> list[str]:
        def fmt(x: float) -> str:
            if x != x:
                return "-"
            if abs(x) >= 100:
                return f"{x:,.0f}"
            if abs(x) >= 10:
                return f"{x:.1f}"
            return f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3f}"

        v, b = self.med(self.values), self.med(self.baseline)
        spread = f"{fmt(min(self.values))}..{fmt(max(self.values))}" if self.values else "-"
        ratio = self.ratio()
        base = f"{fmt(b)} ({self.baseline_name})" if self.baseline else "-"
        met = {True: "yes", False: "no", None: ""}[self.met()]
        return [
            self.name,
            f"{fmt(v)} {self.unit}",
            spread,
            base,
            "-" if ratio != ratio else f"{ratio:.2f}",
            self.target,
            met,
        ]


# A target: a comparison (none: equal), a bound and the bound's unit, if any.
_TARGET = re.compile(r"(>=|<=|<|>|~)?\s*(\d+(?:\.\d+)?)\s*([A-Za-z][\w/-]*)?")


class Table:
    def __init__(self) -> None:
        self.figures: list[Figure] = []
        self.notes: list[str] = []

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        say(" | ".join(figure.row()))
        return figure

    def render(self) -> str:
        header = [
            "measurement",
            "median",
            "min..max",
            "baseline (same run)",
            "ratio",
            "target",
            "met",
        ]
        rows = [header] + [f.row() for f in self.figures]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in rows
        ]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines + [""] + [f"- {n}" for n in [self.verdict(), *self.notes]])

    def verdict(self) -> str:
        """How many figures with a target met it, and which did not."""
        judged = [(f, f.met()) for f in self.figures]
        judged = [(f, met) for f, met in judged if met is not None]
        missed = [f.name.strip() for f, met in judged if not met]
        told = f"targets met: {len(judged) - len(missed)} of {len(judged)}"
        return told + (f"; missed: {'; '.join(missed)}" if missed else "")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


# --- environment -----------------------------------------------------------------------------


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


def _ping(url: str) -> bool:
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


# --- the benchmark ---------------------------------------------------------------------------


class Bench:
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

    # setup

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
        wait_for(lambda: _ping(url), 10, "redis-server")
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

    # processes

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

    # runs

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

    def raw_chain_rep(self, chains: int, length: int) -> float:
        """Chains of ``length`` no-op tasks, all submitted at once: chains finished per second."""
        from celery import chain

        from bench.rawapp import noop

        self.redis.set("bench:raw:done", 0)
        started = time.time()
        with noop.app.producer_or_acquire() as producer:
            for _ in range(chains):
                chain(*[noop.si() for _ in range(length)]).apply_async(producer=producer)
        wait_for(
            lambda: int(self.redis.get("bench:raw:done") or 0) >= chains * length,
            300,
            "raw chains",
        )
        return chains / (time.time() - started)

    # 1, 9, 10: step throughput, relay cost per run, connections per step

    def m_steps(self) -> None:
        runs = 4 if self.tiny else self.args.runs
        say(f"steps: {runs} runs x 8 no-op steps on one worker -c 2, against raw Celery")
        worker = self.worker(2)
        raw = self.raw_worker(2)
        rates, raw_rates, extras = [], [], []
        run_rates, chain_rates, length = [], [], 8
        self.steps_rep(2)  # warm both processes' connections and imports
        self.raw_rep(20)
        for _ in range(self.reps):
            rate, extra = self.steps_rep(runs)
            rates.append(rate)
            extras.append(extra)
            raw_rates.append(self.raw_rep(int(extra["steps"])))
            # A run is a chain of steps: the same number of runs as raw Celery chains of
            # as many no-op tasks as a run has steps.
            run_rates.append(rate * runs / extra["steps"])
            length = max(1, round(extra["steps"] / runs))
            chain_rates.append(self.raw_chain_rep(runs, length))
        self.table.add(
            Figure(
                "1. step throughput (1 worker, -c 2)",
                "steps/s",
                rates,
                raw_rates,
                "raw no-op tasks/s",
            )
        )
        self.table.add(
            Figure(
                f"1. runs/s ({runs} runs of {length} steps)",
                "runs/s",
                run_rates,
                chain_rates,
                f"raw {length}-task no-op chains/s",
            )
        )
        key = lambda k: [e[k] for e in extras]  # noqa: E731
        self.table.add(
            Figure(
                f"9. relay tasks per run ({runs}-run burst)",
                "",
                key("relay_per_run"),
                target="<= 3",
            )
        )
        self.table.add(Figure("9. consumer tasks per run", "", key("consume_per_run")))
        self.table.add(
            Figure("9. events-queue backlog at last commit", "msgs", key("backlog_at_end"))
        )
        self.table.add(
            Figure("9. backlog zero after last commit", "s", key("drain_seconds"), target="<= 2")
        )
        self.table.add(
            Figure("10. new DB connections per step", "", key("connections_per_step"), target="~0")
        )
        self.procs.stop(raw)
        for child in worker:
            self.procs.stop(child)

    # 2: wake latency

    def m_wake(self) -> None:
        samples = 5 if self.tiny else self.args.wake_samples
        say(f"wake: {samples} single runs on an idle worker, against raw delay() -> start")
        from django.db import transaction

        from bench.rawapp import stamp
        from runs.services import task_submit

        worker = self.worker(2)
        raw = self.raw_worker(2)
        p50s, p99s, raw50, raw99 = [], [], [], []
        for _ in range(self.reps):
            latencies = []
            for _ in range(samples + 1):
                committed: list[float] = []
                with transaction.atomic():
                    transaction.on_commit(lambda: committed.append(time.time()))  # noqa: B023
                    run = task_submit(
                        workspace=self.workspace,
                        repository=self.repository,
                        instruction="bench",
                    ).run
                self.wait_terminal([run.id], timeout=60)
                self.worker_idle_wait()
                started = float(self.redis.get(f"bench:started:{run.id}"))
                latencies.append(started - committed[0])
            latencies = latencies[1:]  # the first warms the worker process
            p50s.append(pct(latencies, 0.5) * 1000)
            p99s.append(pct(latencies, 0.99) * 1000)
            self.redis.delete("bench:raw:latency")
            for _ in range(samples + 1):
                n = self.redis.llen("bench:raw:latency")
                stamp.delay(time.time())
                wait_for(lambda: self.redis.llen("bench:raw:latency") > n, 30, "raw stamp")  # noqa: B023
                time.sleep(0.05)
            raw_latencies = [float(x) for x in self.redis.lrange("bench:raw:latency", 1, -1)]
            raw50.append(pct(raw_latencies, 0.5) * 1000)
            raw99.append(pct(raw_latencies, 0.99) * 1000)
        self.table.add(
            Figure(
                "2. wake latency p50 (commit -> step work starts)",
                "ms",
                p50s,
                raw50,
                "raw delay() -> start",
            )
        )
        self.table.add(
            Figure(
                "2. wake latency p99",
                "ms",
                p99s,
                raw99,
                "raw delay() -> start",
            )
        )
        self.procs.stop(raw)
        for child in worker:
            self.procs.stop(child)

    def worker_idle_wait(self) -> None:
        """Until the worker is idle again: no relay pass due and no message queued or
        being worked on; then as long as the raw baseline's pause between samples.

        A run's end leaves its events' last relay pass due a coalescing window later
        (``OUTBOX_RELAY_COALESCE_SECONDS``), and its consumers after that: a fixed pause
        shorter than the window started the next sample beside them.
        """
        from jobs.relay import RELAY_SCHEDULED_KEY

        queues = broker_queue_keys()

        def idle() -> bool:
            return (
                not self.redis.exists(RELAY_SCHEDULED_KEY)
                and not self.broker.hlen("unacked")
                and not any(self.broker.llen(q) for q in queues)
            )

        wait_for(idle, 30, "an idle worker", every=0.01)
        time.sleep(0.05)

    # 3: outbox relay

    def outbox_rows(self, n: int) -> list[Any]:
        import uuid

        from jobs.models import OutboxEvent

        template = OutboxEvent.objects.order_by("-id").first()
        payload = dict(template.payload) if template else {"type": "agent.run.status.changed"}
        rows = []
        for i in range(n):
            p = dict(payload, id=str(uuid.uuid4()))
            rows.append(
                OutboxEvent(
                    event_id=p["id"],
                    type=p.get("type", "agent.run.status.changed"),
                    partition_key=f"bench-{i % 1000}",
                    payload=p,
                )
            )
        return rows

    def m_relay(self) -> None:
        backlog = 2000 if self.tiny else self.args.backlog
        burst = 500 if self.tiny else self.args.burst
        say(f"relay: drain a backlog of {backlog} against inserting it; lag after a {burst} burst")
        from django.db import transaction

        from jobs.models import OutboxEvent
        from jobs.relay import outbox_drain, relay_wake

        if not OutboxEvent.objects.exists():
            self.m_steps_minimal()  # a real event to copy
        rates, insert_rates, lags = [], [], []
        for _ in range(self.reps):
            rows = self.outbox_rows(backlog)
            started = time.monotonic()
            for i in range(0, len(rows), 1000):
                OutboxEvent.objects.bulk_create(rows[i : i + 1000])
            insert_rates.append(backlog / (time.monotonic() - started))
            started = time.monotonic()
            while outbox_drain().published:
                pass
            rates.append(backlog / (time.monotonic() - started))
            self.broker_purge()
        worker = self.worker(2)
        for _ in range(self.reps):
            rows = self.outbox_rows(burst)
            with transaction.atomic():
                OutboxEvent.objects.bulk_create(rows, batch_size=1000)
                transaction.on_commit(relay_wake)
            started = time.monotonic()
            wait_for(
                lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(),
                120,
                "outbox lag zero",
                every=0.05,
            )
            lags.append(time.monotonic() - started)
            # The consumers' share of the burst is not what is measured: drop it.
            self.broker.delete("events")
        for child in worker:
            self.procs.stop(child)
        self.broker_purge()
        self.table.add(
            Figure(
                f"3. relay publish, backlog {backlog:,}",
                "events/s",
                rates,
                insert_rates,
                "batch INSERT rows/s",
                ">= 0.3",
            )
        )
        self.table.add(
            Figure(
                f"3. outbox lag to zero after {burst:,} burst",
                "s",
                lags,
                target="<= 10 s",
            )
        )

    # 4, 5: web

    @contextmanager
    def server(
        self,
        layout: str,
        workers: int = 2,
        application: str = "agentplatform.asgi:application",
        tree: Path = ROOT,
        **env: str,
    ) -> Iterator[int]:
        port = free_port()
        if layout == "asgi":
            # The production web server; a tree from before it (``--only compare``)
            # under uvicorn's own workers, as that tree was deployed.
            if (tree / "agentplatform" / "web.py").exists():
                launcher = ["agentplatform.web", "--application", application]
            else:
                launcher = ["uvicorn", application]
            argv = [
                PY,
                "-m",
                *launcher,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        else:
            argv = [
                PY,
                "-m",
                "gunicorn",
                "agentplatform.wsgi:application",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                str(workers),
                "--log-level",
                "warning",
            ]
        # Another tree's server (``--only compare``) imports that tree's code.
        if tree != ROOT:
            env = {"PYTHONPATH": str(tree), **env}
        child = self.procs.start(f"web-{layout}", argv, cwd=tree, **env)
        import socket

        def up() -> bool:
            if child.poll() is not None:
                raise RuntimeError(f"web {layout} exited; see {self.logdir}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(up, 60, f"web {layout}", every=0.1)
        self.load(port, "insert", conns=4, seconds=1)  # warm every worker process
        try:
            yield port
        finally:
            self.procs.stop(child)

    def load(self, port: int, kind: str, conns: int, seconds: float, **extra: Any) -> dict:
        argv = [
            PY,
            "-m",
            "bench.http_load",
            "--port",
            str(port),
            "--kind",
            kind,
            "--conns",
            str(conns),
            "--seconds",
            str(seconds),
        ]
        for key, value in extra.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        out = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, check=True)
        return json.loads(out.stdout)

    def measure(
        self, port: int, kind: str, conns: int, seconds: float, **extra: Any
    ) -> tuple[dict, dict]:
        """The one-INSERT view and ``kind`` taking turns on the same connections, a
        slice of a second each, ``seconds`` of each in all, after a second of ``kind``'s
        requests on 4 connections, unmeasured.

        The warm-up pays before the window what a process loads or prepares on its first
        request of a kind (an endpoint's code paths, each pooled connection's prepared
        statements), as the server's start-up warm-up pays it for the one-INSERT view.
        Taking turns, a figure and its baseline see the machine alike: this machine's
        speed drifts by a third within a minute, more than any figure's difference, and
        back-to-back windows of five seconds each measured it as much as the code."""
        warm = 0.3 if self.tiny else 1.0
        self.load(port, kind, conns=4, seconds=warm, **extra)
        turns = self.load(
            port,
            f"insert,{kind}",
            conns,
            2 * seconds,
            # Also at smoke sizes: on a loaded machine a request can take longer than a
            # shorter turn, which then counts none of its kind.
            slice=1.0,
            **extra,
        )
        return turns["by_kind"]["insert"], turns["by_kind"][kind]

    # What ``--only parts`` makes free in turn (bench.asgi_parts), and how the table says it.
    SUBMISSION_PARTS = {
        "": "as it is",
        "statement": "its one statement free",
        "round_trip": "its Redis round trip free",
        "message": "its run's Celery message free",
    }

    def m_parts(self) -> None:
        """Where a submission's cost goes (not in the default run): figure 5's
        submissions against the one-INSERT view, on servers that are the product's except
        for one part of the submission, made free (``bench.asgi_parts``). A part's share
        is how far the ratio rises without it. Every server runs from the start; the
        parts take turns, in reverse order every other repetition, each repetition on a
        settled database as figure 5's."""
        seconds = 1.0 if self.tiny else self.args.seconds
        token = self.token()
        self.reads_fixture()  # figure 5's database
        submissions: dict[str, list[float]] = {part: [] for part in self.SUBMISSION_PARTS}
        baselines: dict[str, list[float]] = {part: [] for part in self.SUBMISSION_PARTS}
        say(f"parts: {len(submissions)} servers, {seconds:.0f} s per figure")
        with ExitStack() as servers:
            ports = {
                part: servers.enter_context(
                    self.server("asgi", application="bench.asgi_parts:application", BENCH_FREE=part)
                )
                for part in self.SUBMISSION_PARTS
            }
            for rep in range(self.reps):
                # Each repetition starts where figure 5's do: no queued runs, a settled
                # database.
                self.quiesce()
                self.database_settle()
                order = list(self.SUBMISSION_PARTS)
                for part in order if rep % 2 == 0 else order[::-1]:
                    baseline, figure = self.measure(
                        ports[part],
                        "submit",
                        32,
                        seconds,
                        token=token,
                        repository=self.repository.pk,
                    )
                    baselines[part].append(baseline["rps"])
                    submissions[part].append(figure["rps"])
        for part, label in self.SUBMISSION_PARTS.items():
            self.table.add(
                Figure(
                    f"5. POST /api/tasks/, {label}",
                    "req/s",
                    submissions[part],
                    baselines[part],
                    "one-INSERT view, asgi",
                )
            )

    def m_compare(self) -> None:
        """Figures 4 and 5 of this tree against those of another revision (``--against``),
        in one run (not in the default run): a server of each, taking turns on the same
        database, broker and connections, each figure against its own one-INSERT view as
        figures 4 and 5 measure it. The machine's drift, which moves a figure between
        runs by more than most changes do, is then the same for both. The other
        revision is checked out in a temporary git worktree and served with this tree's
        environment; it runs on the schema this tree migrated, so it is for changes that
        leave the schema as it is."""
        against = self.args.against
        seconds = 1.0 if self.tiny else self.args.seconds
        token = self.token()
        body = self.ping_body()
        self.reads_fixture()  # figure 5's database
        revision = _git("rev-parse", "--short", against)
        here = _git("rev-parse", "--short", "HEAD")
        if _git("status", "--porcelain", "--untracked-files=no"):
            here += " and changes"
        there = against if revision.startswith(against) else f"{against} ({revision})"
        labels = {"here": f"this tree ({here})", "there": there}
        kinds = {
            "submit": ("5. POST /api/tasks/", {"token": token, "repository": self.repository.pk}),
            "webhook": ("4. webhook intake", {"secret": GITHUB_SECRET, "body_file": body}),
        }
        measured: dict[tuple[str, str], tuple[list[float], list[float]]] = {
            (side, kind): ([], []) for side in labels for kind in kinds
        }
        say(f"compare: this tree against {against} ({revision}), {seconds:.0f} s per figure")
        with tempfile.TemporaryDirectory(prefix="agentplatform-compare-") as scratch:
            tree = Path(scratch) / "tree"
            _git("worktree", "add", "--detach", str(tree), revision)
            try:
                with ExitStack() as servers:
                    ports = {
                        "here": servers.enter_context(self.server("asgi")),
                        "there": servers.enter_context(self.server("asgi", tree=tree)),
                    }
                    for rep in range(self.reps):
                        self.quiesce()
                        self.database_settle()
                        sides = list(labels) if rep % 2 == 0 else list(labels)[::-1]
                        for side in sides:
                            for kind, (_, extra) in kinds.items():
                                baseline, figure = self.measure(
                                    ports[side], kind, 32, seconds, **extra
                                )
                                measured[side, kind][0].append(figure["rps"])
                                measured[side, kind][1].append(baseline["rps"])
            finally:
                _git("worktree", "remove", "--force", str(tree))
        for kind, (name, _) in kinds.items():
            for side, label in labels.items():
                values, baselines = measured[side, kind]
                self.table.add(
                    Figure(f"{name}, {label}", "req/s", values, baselines, "one-INSERT view, asgi")
                )

    def ping_body(self) -> Path:
        """A GitHub ping delivery's body for the webhook figures (a real one if the corpus
        is there)."""
        body = ROOT / "bench" / "ping.json"
        corpus = Path("/work/shared/corpus/github/ping")
        body.write_bytes(
            next(iter(sorted(corpus.glob("*.json")))).read_bytes()
            if corpus.is_dir()
            else b'{"zen":"Keep it logically awesome.","hook_id":1}'
        )
        return body

    def token(self) -> str:
        from django.contrib.auth import get_user_model

        from agentplatform.api.auth import api_token_issue
        from runs.models import Membership

        user, _ = get_user_model().objects.get_or_create(username="bench")
        Membership.objects.get_or_create(
            workspace=self.workspace, user=user, defaults={"role": "admin"}
        )
        return api_token_issue(user=user, name="bench")[1]

    def m_web(self) -> None:
        seconds = 1.0 if self.tiny else self.args.seconds
        conns = 32
        say(f"web: {conns} connections, {seconds:.0f} s per figure")
        body = self.ping_body()
        token = self.token()
        figures: dict[str, list[Any]] = {
            k: []
            for k in (
                "webhook",
                "insert",
                "submit",
                "api_layer",
                "wsgi_insert",
                "webhook64",
                "runs",
                "events",
            )
        }
        # Each figure's baseline: the one-INSERT view, taking turns with it (measure()).
        figures.update(
            {f"insert_{k}": [] for k in ("webhook", "submit", "api_layer", "runs", "events")}
        )
        layout = self.args.layout
        run_path = self.reads_fixture()
        for rep in range(self.reps):
            if rep:
                # Each repetition starts where the first did, as each figure does: the
                # runs the last one's submissions queued (nothing steps them here) are
                # ended. Left queued, they made every later repetition's admission count
                # thousands more active runs than the first one's.
                self.quiesce()
                self.database_settle()
            with self.server(layout) as port:

                def pair(name: str, kind: str, **extra: Any) -> None:
                    baseline, figure = self.measure(port, kind, conns, seconds, **extra)
                    figures["insert"].append(baseline)
                    figures[f"insert_{name}"].append(baseline)
                    figures[name].append(figure)

                pair("webhook", "webhook", secret=GITHUB_SECRET, body_file=body)
                pair("submit", "submit", token=token, repository=self.repository.pk)
                pair("api_layer", "api-layer", token=token, repository=self.repository.pk)
                figures["webhook64"].append(
                    self.load(port, "webhook", 64, seconds, secret=GITHUB_SECRET, body_file=body)
                )
                pair("runs", "get", token=token, path="/api/runs/")
                pair("events", "get", token=token, path=run_path)
            with self.server("wsgi") as port:
                figures["wsgi_insert"].append(self.load(port, "insert", conns, seconds))
        rps = lambda k: [r["rps"] for r in figures[k]]  # noqa: E731
        ms = lambda k, p: [r[p] for r in figures[k]]  # noqa: E731
        base = f"one-INSERT view, {layout}"
        self.table.add(
            Figure(
                "4. webhook intake (32 conns)",
                "req/s",
                rps("webhook"),
                rps("insert_webhook"),
                base,
                ">= 0.6",
            )
        )
        self.table.add(
            Figure(
                "4. webhook intake p50",
                "ms",
                ms("webhook", "p50_ms"),
                ms("insert_webhook", "p50_ms"),
                base,
            )
        )
        self.table.add(
            Figure(
                "4. webhook intake p99",
                "ms",
                ms("webhook", "p99_ms"),
                ms("insert_webhook", "p99_ms"),
                base,
            )
        )
        self.table.add(
            Figure(
                f"4. one-INSERT view, production layout ({layout})",
                "req/s",
                rps("insert"),
                rps("wsgi_insert"),
                "same view, gunicorn sync",
                ">= 0.6",
            )
        )
        self.table.add(
            Figure(
                "4. webhook errors (5xx/io) at 64 conns, defaults",
                "",
                [r["errors"] for r in figures["webhook64"]],
                target="0",
            )
        )
        self.table.add(
            Figure(
                "4. webhook errors at 32 conns",
                "",
                [r["errors"] for r in figures["webhook"]],
                target="0",
            )
        )
        self.table.add(
            Figure(
                "5. POST /api/tasks/ (32 conns)",
                "req/s",
                rps("submit"),
                rps("insert_submit"),
                base,
                ">= 0.4",
            )
        )
        self.table.add(
            Figure(
                "5.   its API layer over one INSERT",
                "req/s",
                rps("api_layer"),
                rps("insert_api_layer"),
                base,
            )
        )
        self.table.add(
            Figure(
                f"5. GET /api/runs/ over {self.read_runs:,} runs",
                "req/s",
                rps("runs"),
                rps("insert_runs"),
                base,
                ">= 0.5",
            )
        )
        self.table.add(
            Figure(
                "5. GET a run's events",
                "req/s",
                rps("events"),
                rps("insert_events"),
                base,
                ">= 0.5",
            )
        )
        errors = {
            k: sum(r["errors"] for r in v)
            for k, v in figures.items()
            if not k.startswith("insert_")  # each also in "insert"
        }
        self.table.notes.append(f"web errors by figure: {errors}")

    # 6: scale

    FILL_WORKSPACES = 10

    def finished_fill(self, total: int) -> None:
        """Finished runs up to ``total``, made in PostgreSQL (INSERT ... SELECT over
        generate_series), cloned from one real finished run so every column is one the
        platform wrote.

        The history looks like a service's: half the runs belong to the benchmark's
        workspace and the rest to nine others, created over the last 90 days; 80 %
        completed, 12 % failed, 6 % cancelled, 2 % timed out; each with 2-9 of the
        template run's events and one published outbox row.
        """
        from django.db import connection

        from runs.models import Repository, Run, Workspace

        have = Run.objects.count()
        if have >= total:
            return
        if getattr(self, "fill_template", None) is None:
            template = Run.objects.filter(status="completed").order_by("created_at").first()
            if template is None:
                self.m_steps_minimal()
                template = Run.objects.filter(status="completed").first()
            self.fill_template = template
            others = []
            for i in range(self.FILL_WORKSPACES - 1):
                workspace = Workspace.objects.create(slug=f"fill-{i}", name=f"fill {i}")
                others.append(
                    Repository.objects.create(
                        workspace=workspace, name=f"fill-{i}", clone_url="/dev/null"
                    )
                )
            self.fill_repositories = [self.repository, *others]
        template = self.fill_template
        say(f"filling to {total:,} finished runs")
        started = time.monotonic()

        def columns(table: str) -> list[str]:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                    "ORDER BY ordinal_position",
                    [table],
                )
                return [c for (c,) in cursor.fetchall()]

        def clone(table: str, overrides: dict[str, str], where: str) -> str:
            cols = columns(table)
            select = ", ".join(overrides.get(c, f"t.{c}") for c in cols)
            return (
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {select} "
                f"FROM {table} t, m WHERE {where}"
            )

        # Repository i of the list (0: the benchmark's) for half the runs and the others
        # in turn; status by share; creation over 90 days; how many events. (``%%``: the
        # statement has parameters.)
        repos = [r.pk for r in self.fill_repositories]
        spaces = [r.workspace_id for r in self.fill_repositories]
        n_others = len(repos) - 1
        pick = f"CASE WHEN g %% 2 = 0 THEN 0 ELSE 1 + (g / 2) %% {n_others} END"
        status = (
            "CASE WHEN g %% 50 < 40 THEN 'completed' WHEN g %% 50 < 46 THEN 'failed' "
            "WHEN g %% 50 < 49 THEN 'cancelled' ELSE 'timed_out' END"
        )
        chunk = 100_000
        with connection.cursor() as cursor:
            # Consistent by construction (every reference is to a row made here first):
            # the fill skips the per-row foreign-key triggers and the commit flush.
            cursor.execute("SET session_replication_role = replica")
            cursor.execute("SET synchronous_commit = off")
            try:
                while have < total:
                    n = min(chunk, total - have)
                    cursor.execute("DROP TABLE IF EXISTS m")
                    cursor.execute(
                        "CREATE TEMP TABLE m AS SELECT gen_random_uuid() tid, "
                        "gen_random_uuid() rid, g, "
                        f"(%s::int[])[1 + {pick}] repo, (%s::bigint[])[1 + {pick}] ws, "
                        f"{status} st, "
                        "now() - random() * interval '90 days' created, "
                        "2 + (g::bigint * 7919) %% 8 nev FROM generate_series(%s, %s) g",
                        [repos, spaces, have + 1, have + n],
                    )
                    cursor.execute(
                        clone(
                            "runs_task",
                            {
                                "id": "m.tid",
                                "idempotency_key": "NULL",
                                "workspace_id": "m.ws",
                                "repository_id": "m.repo",
                                "status": "CASE m.st WHEN 'timed_out' THEN 'failed' ELSE m.st END",
                                "created_at": "m.created",
                                "updated_at": "m.created + interval '5 minutes'",
                            },
                            "t.id = %s",
                        ),
                        [template.task_id],
                    )
                    cursor.execute(
                        clone(
                            "runs_run",
                            {
                                "id": "m.rid",
                                "task_id": "m.tid",
                                "workspace_id": "m.ws",
                                "repository_id": "m.repo",
                                "status": "m.st",
                                "created_at": "m.created",
                                "started_at": "m.created + interval '1 second'",
                                "finished_at": "m.created + interval '5 minutes'",
                                "status_changed_at": "m.created + interval '5 minutes'",
                            },
                            "t.id = %s",
                        ),
                        [template.pk],
                    )
                    cursor.execute(
                        clone(
                            "runs_runevent",
                            {
                                "id": "gen_random_uuid()",
                                "run_id": "m.rid",
                                "created_at": "m.created + t.sequence_no * interval '10 s'",
                            },
                            "t.run_id = %s AND t.sequence_no <= m.nev",
                        ),
                        [template.pk],
                    )
                    cursor.execute(
                        clone(
                            "jobs_outboxevent",
                            {
                                "id": "nextval('jobs_outboxevent_id_seq')",
                                "event_id": "gen_random_uuid()",
                                "partition_key": "m.rid::text",
                                "created_at": "m.created",
                                "published_at": "m.created + interval '1 second'",
                            },
                            "t.id = (SELECT min(id) FROM jobs_outboxevent)",
                        )
                    )
                    have += n
                cursor.execute("DROP TABLE IF EXISTS m")
            finally:
                cursor.execute("SET session_replication_role = DEFAULT")
                cursor.execute("SET synchronous_commit = DEFAULT")
        # A service's tables of finished rows are vacuumed by autovacuum (off on some
        # machines): without it the visibility map of the freshly filled tables is empty
        # and every index-only scan reads the table too.
        self.database_settle()
        took = time.monotonic() - started
        say(f"filled to {have:,} runs in {took:.0f} s")
        self.table.notes.append(f"fill to {have:,} finished runs: {took:.0f} s")

    def m_steps_minimal(self) -> None:
        worker = self.worker(2, name="fill-worker")
        self.wait_terminal(self.submit(1))
        for child in worker:
            self.procs.stop(child)

    def reads_fixture(self) -> str:
        """The database figures 4 and 5 are measured on (finished runs, analysed), also
        for ``--only parts`` and ``--only compare``, which measure figure 5 again; the
        path of one run's events.

        On a database analysed while it had no runs, a submission's foreign-key checks
        read the whole runs table: PostgreSQL plans each check once per connection, and
        with statistics that say the table is empty it chose a sequential scan. Each
        submission's run then made the next checks slower (PostgreSQL's CPU a submission
        0.71 ms in the first 5 s of submissions, 2.86 ms in the sixth 5 s), until the
        table was analysed again."""
        from runs.models import Run

        self.read_runs = 2_000 if self.tiny else self.args.read_runs
        self.finished_fill(self.read_runs)
        self.read_runs = Run.objects.count()
        # One of the benchmark workspace's own runs: the fill gives others to nine more.
        run = (
            Run.objects.filter(status="completed", task__repository=self.repository)
            .order_by("created_at")
            .first()
        )
        return f"/api/runs/{run.pk}/events/"

    def m_scale(self) -> None:
        """Lease acquisition and admission over a database grown to each of the sizes,
        each size taking turns with the smallest one: a copy of the database made when it
        held the smallest size (``database_copy``). Measured minutes apart, the two met a
        machine whose speed had moved by more than the target's margin (the 1,000,000-run
        figure at 1.60x in one run, 1.01x when measured again alone)."""
        sizes = [1_000, 5_000] if self.tiny else self.args.scale_sizes
        say(f"scale: lease acquisition and admission at {sizes} finished runs")
        # The first fill may step a real run to copy: before wake-ups are switched off.
        self.finished_fill(sizes[0])
        small, large = sizes[0], sizes[-1]
        main = self.env["BENCH_DATABASE"]
        copy = f"{main}_small"
        # Nothing consumes these wake-ups here: what is timed is the database work.
        from runs import dispatch

        original = dispatch.run_wake
        dispatch.run_wake = lambda **kwargs: None
        # Per size: its turns' medians, and those of the smallest size's turns with it.
        measured: dict[int, dict[str, list[float]]] = {}
        try:
            self.database_copy(copy)
            with self.database_named(copy):
                self.database_settle()
            for size in sizes[1:]:
                self.finished_fill(size)
                got = measured[size] = {"lease": [], "admit": [], "lease_at": [], "admit_at": []}
                for rep in range(self.reps):
                    sides = [("", main), ("_at", copy)]
                    for suffix, database in sides if rep % 2 == 0 else sides[::-1]:
                        with self.database_named(database):
                            lease, admit = self.scale_turn()
                        got["lease" + suffix].append(lease)
                        got["admit" + suffix].append(admit)
                say(
                    f"scale {size:,}: lease {statistics.median(got['lease']):.2f} ms, "
                    f"admission {statistics.median(got['admit']):.2f} ms; in turns with it, "
                    f"{small:,}: lease {statistics.median(got['lease_at']):.2f} ms, "
                    f"admission {statistics.median(got['admit_at']):.2f} ms"
                )
            wal = self.wal_per_submission(50 if self.tiny else 300)
        finally:
            dispatch.run_wake = original
            database_drop(self.env, copy)
        figures = measured[large]
        self.table.add(
            Figure(
                f"6. lease acquisition, {large:,} finished runs",
                "ms",
                figures["lease"],
                figures["lease_at"],
                f"same at {small:,}, in turns",
                "<= 1.3x",
            )
        )
        self.table.add(
            Figure(
                f"6. admission (task_submit), {large:,} finished runs",
                "ms",
                figures["admit"],
                figures["admit_at"],
                f"same at {small:,}, in turns",
                "<= 1.3x",
            )
        )
        self.table.add(
            Figure(
                f"6. WAL per submission after a checkpoint, {large:,} finished runs",
                "kB",
                wal["wal"],
                wal["wal_random"],
                "same, random UUIDv4 ids",
            )
        )
        self.table.add(
            Figure(
                f"6. submission after a checkpoint, {large:,} finished runs",
                "ms",
                wal["ms"],
                wal["ms_random"],
                "same, random UUIDv4 ids",
            )
        )

    def scale_turn(self, timed: int = 30, untimed: int = 5) -> tuple[float, float]:
        """One turn of figure 6 on the current database: the medians, in ms, of lease
        acquisition and of admission (``task_submit``) over ``timed`` submissions, after
        ``untimed`` that pay for the new connection (its prepared statements)."""
        from django.db import transaction

        from runs.lease import lease_acquire, lease_release
        from runs.models import Run
        from runs.services import task_submit

        lat_l, lat_a = [], []
        for i in range(untimed + timed):
            t = time.perf_counter()
            run = task_submit(
                workspace=self.workspace, repository=self.repository, instruction="bench"
            ).run
            admitted = time.perf_counter() - t
            t = time.perf_counter()
            held = lease_acquire(run_id=run.id, step_no=0, owner="bench")
            leased = time.perf_counter() - t
            lease_release(held)
            with transaction.atomic():
                Run.objects.filter(pk=run.pk).update(status="cancelled", finished_at=run.created_at)
            if i >= untimed:
                lat_a.append(admitted)
                lat_l.append(leased)
        return statistics.median(lat_l) * 1000, statistics.median(lat_a) * 1000

    def database_copy(self, name: str) -> None:
        """``name`` (dropped first) as a copy of the benchmark's database as it is now.
        PostgreSQL copies a database only while no one else is connected to it: this
        process's connections are closed first, and any left by a stopped child ended."""
        import psycopg
        from django.db import connections

        connections.close_all()
        with psycopg.connect(self.env["BENCH_ADMIN_URL"], autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [self.env["BENCH_DATABASE"]],
            )
        database_recreate(self.env, name, template=self.env["BENCH_DATABASE"])

    @contextmanager
    def database_named(self, name: str) -> Iterator[None]:
        """This process's default connection to database ``name`` inside the block (a new
        connection), and back to the benchmark's own after it."""
        from django.db import connection

        previous = connection.settings_dict["NAME"]
        connection.close()
        connection.settings_dict["NAME"] = name
        try:
            yield
        finally:
            connection.close()
            connection.settings_dict["NAME"] = previous

    def wal_per_submission(self, count: int) -> dict[str, list[float]]:
        """The WAL ``count`` submissions write right after a checkpoint, in kB per
        submission, and their mean time in ms: with the platform's time-ordered ids and,
        alternated with them, with random UUIDv4 ids (``jobs.ids`` made to hand out
        ``uuid.uuid4``). The first change to a page after a checkpoint writes the whole
        page; random keys change a page of every index they enter."""
        import uuid

        from django.db import connection

        from jobs import ids
        from runs.models import Run
        from runs.services import task_submit

        time_ordered = ids.uuid7
        figures: dict[str, list[float]] = {
            "wal": [],
            "wal_random": [],
            "ms": [],
            "ms_random": [],
        }
        try:
            for _ in range(self.reps):
                for random_ids in (False, True):
                    ids.uuid7 = uuid.uuid4 if random_ids else time_ordered
                    with connection.cursor() as cursor:
                        cursor.execute("CHECKPOINT")
                        cursor.execute("SELECT pg_current_wal_lsn()")
                        (start,) = cursor.fetchone()
                    began = time.perf_counter()
                    made = [
                        task_submit(
                            workspace=self.workspace,
                            repository=self.repository,
                            instruction="bench",
                        ).run
                        for _ in range(count)
                    ]
                    took = time.perf_counter() - began
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [start])
                        (written,) = cursor.fetchone()
                    suffix = "_random" if random_ids else ""
                    figures["wal" + suffix].append(float(written) / count / 1024)
                    figures["ms" + suffix].append(took / count * 1000)
                    Run.objects.filter(pk__in=[run.pk for run in made if run]).update(
                        status="cancelled"
                    )
        finally:
            ids.uuid7 = time_ordered
        say(
            "after a checkpoint, per submission: "
            f"{statistics.median(figures['wal']):.1f} kB of WAL and "
            f"{statistics.median(figures['ms']):.2f} ms; with random ids "
            f"{statistics.median(figures['wal_random']):.1f} kB and "
            f"{statistics.median(figures['ms_random']):.2f} ms"
        )
        return figures

    # 7, 10: idle cost

    def m_fairness(self) -> None:
        queued = 100 if self.tiny else 1000
        say(f"fairness: workspace A with {queued} queued runs, then one of workspace B")
        from bench.bench_fairness import small_workspace_start

        slots, seconds = [], []
        for rep in range(self.reps):
            workers: list[Any] = []
            slot, took = small_workspace_start(
                lambda started=workers: started.extend(self.worker(1, name="fair-worker")),
                queued=queued,
                tag=f"{rep}-{time.time_ns()}",
            )
            slots.append(slot)
            seconds.append(took)
            self.procs.stop_all(workers)
            self.broker_purge()
        self.table.add(
            Figure("12. small workspace's task starts at free slot", "slot", slots, target="1")
        )
        self.table.add(Figure("12. small workspace's task started after", "s", seconds))

    def m_idle(self) -> None:
        seconds = 5 if self.tiny else self.args.idle_seconds
        say(f"idle: worker + beat CPU over {seconds} s, against a 100 ms polling loop")
        cpu, poll_cpu, conns, db_cpu = [], [], [], []
        for _ in range(self.reps):
            children = self.worker(2, name="idle-worker", beat=True)
            # Start-up is not idle: every sweep has fired once (the longest common
            # interval is 15 s) and the pool processes have their connections.
            time.sleep(3 if self.tiny else 16)
            pids = [c.pid for c in children]
            backends = self.backend_pids()
            sessions, before = self.sessions(), cpu_seconds(pids)
            db_before = cpu_seconds(backends)
            time.sleep(seconds)
            cpu.append((cpu_seconds(pids) - before) * 60 / seconds)
            # The sweeps' queries cost PostgreSQL CPU too (their backends, kept open).
            db_cpu.append((cpu_seconds(backends) - db_before) * 60 / seconds)
            conns.append((self.sessions() - sessions) * 60 / seconds)
            for child in children:
                self.procs.stop(child)
            poller = self.procs.start(
                "poller",
                [
                    PY,
                    "-c",
                    (
                        "import os,time,psycopg\n"
                        "c=psycopg.connect(os.environ['DATABASE_URL'],autocommit=True)\n"
                        "while True:\n c.execute('SELECT 1').fetchone(); time.sleep(0.1)\n"
                    ),
                ],
            )
            time.sleep(1)
            before = cpu_seconds([poller.pid])
            time.sleep(seconds)
            poll_cpu.append((cpu_seconds([poller.pid]) - before) * 60 / seconds)
            self.procs.stop(poller)
        self.table.add(
            Figure(
                "7. idle CPU, worker (-c 2) + beat",
                "CPU-s/min",
                cpu,
                poll_cpu,
                "100 ms polling loop",
                "< 0.6 CPU-s/min (1% of a core)",
            )
        )
        self.table.add(
            Figure(
                "7. idle PostgreSQL CPU (their backends)",
                "CPU-s/min",
                db_cpu,
            )
        )
        self.table.add(
            Figure(
                "10. new DB connections per idle minute",
                "",
                conns,
                target="~0",
            )
        )

    # 8: end to end

    def m_e2e(self) -> None:
        say("e2e: the demo task on the scripted model, driven step by step in-process")
        from runs import demo, dispatch
        from runs.engine import step_execute
        from runs.models import Repository, Run
        from runs.services import task_submit

        original = dispatch.run_wake
        dispatch.run_wake = lambda **kwargs: None
        per_status: dict[str, list[float]] = {}
        walls = []
        try:
            for rep in range(self.reps):
                origin = demo.sample_repository_create(
                    Path(tempfile.mkdtemp(prefix="bench-e2e-")) / "origin"
                )
                # The demo's repository and scripted agent (``make demo``), on the bench's
                # services.
                repository = Repository.objects.create(
                    workspace=self.workspace,
                    name=f"e2e-{rep}-{os.getpid()}",
                    clone_url=str(origin),
                    test_command=demo.test_command(),
                    allowed_commands=demo.allowed_commands(),
                )
                started = time.perf_counter()
                run = task_submit(
                    workspace=self.workspace,
                    repository=repository,
                    instruction="Fix add() in calc/core.py so that the test suite passes.",
                    model_options={"provider": "scripted", "script": demo.fix_script()},
                ).run
                times: dict[str, float] = {}
                for _ in range(200):
                    current = Run.objects.get(pk=run.pk)
                    if current.status in (
                        "completed",
                        "failed",
                        "cancelled",
                        "timed_out",
                        "awaiting_approval",
                    ):
                        break
                    t = time.perf_counter()
                    step_execute(run_id=str(current.pk), step_no=current.step_no)
                    times[current.status] = times.get(current.status, 0) + time.perf_counter() - t
                walls.append(time.perf_counter() - started)
                for status, seconds in times.items():
                    per_status.setdefault(status, []).append(seconds * 1000)
                self.table.notes.append(f"e2e run {rep}: ended {current.status}")
        finally:
            dispatch.run_wake = original
        self.table.add(Figure("8. end to end, demo task to PR (scripted model)", "s", walls))
        for status, values in per_status.items():
            self.table.add(Figure(f"8.   step time in {status}", "ms", values))

    # 11: capacity

    def backend_pids(self) -> list[int]:
        """PostgreSQL backends serving the bench database (their CPU is ours)."""
        import psycopg

        with psycopg.connect(self.env["BENCH_ADMIN_URL"], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s",
                [self.env["BENCH_DATABASE"]],
            ).fetchall()
        return [pid for (pid,) in rows]

    def m_capacity(self) -> None:
        runs = 4 if self.tiny else self.args.runs
        concurrencies = [1, 2] if self.tiny else [1, 2, 4]
        say(f"capacity: steps/s with {concurrencies} worker processes")
        rates: dict[int, list[float]] = {}
        share: dict[tuple[int, str], list[float]] = {}
        redis_pids = [
            c.pid
            for c in self.procs.children
            if "redis-server" in str(c.args) or "valkey-server" in str(c.args)
        ]
        for c in concurrencies:
            children = self.worker(c, name=f"cap-worker-{c}")
            self.steps_rep(2)
            for _ in range(self.reps):
                groups = {
                    "worker": [child.pid for child in children],
                    "postgres": self.backend_pids(),
                    "redis": redis_pids,
                }
                before = {k: cpu_seconds(v) for k, v in groups.items()}
                t = time.monotonic()
                rate, extra = self.steps_rep(runs)
                elapsed = time.monotonic() - t
                rates.setdefault(c, []).append(rate)
                # Backends opened during the rep are missed; with persistent connections
                # there are next to none (figure 10).
                for k, v in groups.items():
                    used = cpu_seconds(v) - before[k]
                    share.setdefault((c, k), []).append(used / elapsed)
                    share.setdefault((c, k + "_ms"), []).append(used / extra["steps"] * 1000)
            for child in children:
                self.procs.stop(child)
        base = rates[concurrencies[0]]
        for c in concurrencies:
            self.table.add(
                Figure(
                    f"11. steps/s with {c} worker process(es)",
                    "steps/s",
                    rates[c],
                    base,
                    "1 process",
                )
            )
            for k in ("worker", "postgres", "redis"):
                if share[(c, k)] and max(share[(c, k)]) > 0:
                    self.table.add(
                        Figure(f"11.   {k} CPU with {c} process(es)", "cores", share[(c, k)])
                    )
                    self.table.add(
                        Figure(
                            f"11.   {k} CPU per step, {c} process(es)", "ms", share[(c, k + "_ms")]
                        )
                    )

    def m_inflight(self) -> None:
        inflight.from_bench(self.table, tiny=self.tiny, extra=self.args.inflight_args)

    def run(self) -> str:
        chosen = self.args.only.split(",") if self.args.only else MEASUREMENTS
        try:
            self.setup()
            for name in chosen:
                self.quiesce()
                self.database_settle()
                getattr(self, f"m_{name}")()
        except BaseException:
            # What was measured before the failure is still worth seeing.
            print(self.table.render(), flush=True)
            raise
        finally:
            self.teardown()
        return self.table.render()


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def main(argv: list[str] | None = None) -> str:
    supervision.die_with_make()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated: {','.join(MEASUREMENTS)}; also parts (where a submission's "
        "cost goes) and compare (figures 4 and 5 against --against), which the default run "
        "leaves out",
    )
    parser.add_argument(
        "--against",
        default="",
        help="the git revision --only compare measures this tree against (e.g. HEAD~1)",
    )
    parser.add_argument("--tiny", action="store_true", help="smoke sizes (seconds)")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--wake-samples", type=int, default=30)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--read-runs", type=int, default=100_000)
    parser.add_argument(
        "--scale-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000, 100_000, 1_000_000],
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--layout", default="asgi", choices=["asgi", "wsgi"])
    parser.add_argument("--inflight-args", default="", help="e.g. '--runs 50 --latency 2'")
    parser.add_argument(
        "--shared-redis",
        action="store_true",
        help="use REDIS_URL / CELERY_BROKER_URL instead of a redis-server of its own",
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if "compare" in args.only.split(",") and not args.against:
        parser.error("--only compare needs --against REVISION")
    # SIGTERM ends the run like Ctrl-C: the processes it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    table = Bench(args).run()
    print(table)
    return table


if __name__ == "__main__":
    main()
