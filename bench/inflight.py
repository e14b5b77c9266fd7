"""The realistic benchmark: N runs submitted at once, a model answering in L seconds.

One host in production's layout (``agentplatform.layout``: the web server, the threads
worker for ``agent``, the prefork worker for ``verify``, the delivery worker, beat) on a
PostgreSQL and a Redis of its own, against a local OpenAI-compatible model server
(``tests.chaos.modelserver``) that plays a realistic trajectory: the plan, a read, the
edit, the tests, finish, the judge — six requests per run. Every run clones the sample
repository, runs its tests in a sandbox at verification and opens its pull request.

    .venv/bin/python -m bench.inflight --runs 200 --latency 5      # the targets' sizes
    .venv/bin/python -m bench.run --only inflight                  # the same, in make bench

Prints each figure against its target (docs/performance.md, "Runs in flight").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg

from agentplatform import layout
from bench import proctree
from tests.chaos.modelserver import PROFILE, ScriptedModelServer
from tests.chaos.services import PostgresCluster, RedisServer, free_port, remove_tree
from tests.chaos.stack import FOREIGN, realistic_fix_script

ROOT = Path(__file__).resolve().parent.parent
REQUESTS_PER_RUN = 6
SAMPLE_SECONDS = 0.2
TERMINAL = ("completed", "failed", "cancelled", "rejected")


class Host:
    """The services and the processes of one host, started as the docs say."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="agentplatform-inflight-"))
        (self.root / "logs").mkdir()
        self.postgres = PostgresCluster(self.root)
        self.postgres.create_database("inflight")
        self.redis = RedisServer(self.root)
        self.model = ScriptedModelServer(realistic_fix_script(), latency=args.latency)
        self.web_port = free_port()
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        url = self.postgres.url.rsplit("/", 1)[0] + "/inflight"
        base = {k: v for k, v in os.environ.items() if k not in FOREIGN}
        self.env = {
            **base,
            "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
            "DATABASE_URL": url,
            "CELERY_BROKER_URL": self.redis.url,
            "REDIS_URL": self.redis.url,
            "SECRET_KEY": "inflight-secret-key-long-enough-for-the-production-check-0123",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "AGENTPLATFORM_VAR_DIR": str(self.root / "var"),
            "LOCAL_REPOSITORY_ROOTS": str(self.root),
            "MODEL_PROFILES": json.dumps({PROFILE: self.model.profile()}),
            "API_THROTTLE_USER_RATE": "",
            "API_THROTTLE_TOKEN_RATE": "",
            "API_THROTTLE_ANON_RATE": "",
            "LOG_JSON": "false",
            "PYTHONUNBUFFERED": "1",
        }

    def manage(self, *argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(argv)}: {done.stderr[-2000:]}")
        return done.stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput", "-v", "0")
        web = [sys.executable, "-m", "agentplatform.web", "--host", "127.0.0.1"]
        web += ["--port", str(self.web_port), "--workers", str(layout.WEB_PROCESSES)]
        self._spawn("web", [*web, "--no-access-log"], {})
        for worker in layout.host_workers(agent_threads=self.args.agent_threads):
            self._spawn(f"worker-{worker.name}", worker.argv(sys.executable), worker.env)
        beat = [sys.executable, "-m", "celery", "-A", "agentplatform", "beat"]
        self._spawn("beat", [*beat, "--pidfile", str(self.root / "beat.pid")], {})
        self._wait_ready()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.root / "logs" / f"{name}.log", "ab") as log:
            self.children[name] = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**self.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        pending = set(self.children) - {"beat"}
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                if self.children[name].poll() is not None:
                    raise RuntimeError(f"{name} exited: see {self.root}/logs/{name}.log")
                if name == "web":
                    try:
                        if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                            pending.discard(name)
                    except httpx.HTTPError:
                        pass
                elif b"ready." in (self.root / "logs" / f"{name}.log").read_bytes():
                    pending.discard(name)
            time.sleep(0.2)
        if pending:
            raise RuntimeError(f"not ready: {sorted(pending)} (logs in {self.root}/logs)")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def pids(self, *prefixes: str) -> list[int]:
        return [c.pid for n, c in self.children.items() if n.startswith(prefixes)]

    def postgres_pid(self) -> int:
        return int((self.postgres.data / "postmaster.pid").read_text().split()[0])

    def scope(self) -> tuple[str, int]:
        """An API token of a workspace member and the workspace's sample repository."""
        script = (
            "from runs import demo\n"
            "from runs.models import Repository, Workspace\n"
            "from django.core.management import call_command\n"
            "import io\n"
            f"n = {self.args.runs}\n"
            "w = Workspace.objects.create(slug='inflight', name='inflight', max_active_runs=n)\n"
            "out = io.StringIO()\n"
            "call_command('issue_token', user='bench', workspace='inflight', stdout=out)\n"
            "from pathlib import Path\n"
            f"origin = demo.sample_repository_create(Path({str(self.root)!r}) / 'origin')\n"
            "r = Repository.objects.create(workspace=w, name='calc', clone_url=str(origin),"
            " test_command=demo.test_command(), allowed_commands=demo.allowed_commands(),"
            " max_active_runs=n)\n"
            "print(out.getvalue().strip().splitlines()[-1], r.pk)\n"
        )
        token, repository = self.manage("shell", "-c", script).split()[-2:]
        return token, int(repository)

    def stop(self) -> None:
        from runs.management.process_groups import process_groups_stop

        process_groups_stop(list(self.children.values()), timeout=30)
        self.redis.destroy()
        self.postgres.destroy()
        self.model.close()
        if not self.args.keep:
            remove_tree(self.root)


class Sampler:
    """Runs waiting on the model, runs in flight, connections, worker memory, children."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.db = psycopg.connect(host.env["DATABASE_URL"], autocommit=True)
        self.waiting: list[int] = []
        self.in_flight: list[int] = []
        self.connections: list[int] = []
        self.memory: list[int] = []
        self.memory_idle = 0
        self.children = proctree.ChildSampler()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        workers = self.host.pids("worker-")
        tick = 0
        while not self.done.wait(SAMPLE_SECONDS):
            self.waiting.append(self.host.model.in_flight)
            table = proctree.processes()
            self.children.sample(table, workers)
            tick += 1
            if tick % 5:
                continue
            row = self.db.execute(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                "'client backend' AND pid <> pg_backend_pid()), (SELECT count(*) FROM "
                "runs_run WHERE status <> ALL(%s))",
                [list(TERMINAL)],
            ).fetchone()
            assert row is not None
            self.connections.append(row[0])
            self.in_flight.append(row[1])
            platform = proctree.platform_processes(table, workers)
            self.memory.append(sum(proctree.pss_bytes(p.pid) for p in platform))

    def ended(self) -> dict[str, int]:
        rows = self.db.execute("SELECT status, count(*) FROM runs_run GROUP BY 1").fetchall()
        return {status: count for status, count in rows}


def cpu_accounts(host: Host) -> dict[str, float]:
    table = proctree.processes()
    accounts: dict[str, float] = {}
    children = 0.0
    for name in host.children:
        own, theirs = proctree.tree_cpu(table, host.pids(name))
        accounts[f"Python: {name}"] = own
        children += theirs
    accounts["platform children"] = children
    postgres = proctree.descendants(table, [host.postgres_pid()])
    accounts["PostgreSQL"] = sum(p.own + p.reaped for p in postgres)
    redis_pid = host.redis.process.pid if host.redis.process else 0
    redis = proctree.descendants(table, [redis_pid])
    accounts["Redis"] = sum(p.own + p.reaped for p in redis)
    return accounts


def traffic(host: Host) -> dict[str, float]:
    """PostgreSQL transactions and Redis commands so far: what a run costs the shared
    services, the figures that size them (docs/capacity.md)."""
    import redis

    with psycopg.connect(host.env["DATABASE_URL"], autocommit=True) as db:
        row = db.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    client = redis.Redis.from_url(host.redis.url)
    commands = client.info("stats")["total_commands_processed"]
    client.close()
    return {"PostgreSQL transactions": float(row[0] if row else 0), "Redis commands": commands}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    host = Host(args)
    try:
        host.start()
        token, repository = host.scope()
        time.sleep(3)  # start-up work (beat's first ticks, pools filling) settles
        sampler = Sampler(host)
        idle = proctree.platform_processes(proctree.processes(), host.pids("worker-"))
        sampler.memory_idle = sum(proctree.pss_bytes(p.pid) for p in idle)
        before = cpu_accounts(host)
        sent_before = traffic(host)
        busy_before = proctree.machine_busy_seconds()
        started = time.monotonic()
        sampler.thread.start()
        statuses = submit_all(host, token, repository, args.runs)
        deadline = started + args.timeout
        ended: dict[str, int] = {}
        while time.monotonic() < deadline:
            ended = sampler.ended()
            if sum(ended.get(s, 0) for s in TERMINAL) >= args.runs:
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
        sampler.done.set()
        sampler.thread.join()
        after = cpu_accounts(host)
        busy = proctree.machine_busy_seconds() - busy_before
        result = report(args, host, sampler, before, after, wall, ended, statuses)
        # What else ran on the machine meanwhile (other users of a shared machine, this
        # benchmark's own model server and sampling): cores the platform did not have.
        result["other_load_cores"] = max(0.0, busy - sum(result["cpu_s"].values())) / wall
        left = max(0.1, result["cores"] - result["other_load_cores"])
        result["limit_on_cores_left_s"] = max(
            result["one_run_model_s"], result["cpu_work_per_core_s"] * result["cores"] / left
        )
        sent = traffic(host)
        result["per_run"] = {k: (sent[k] - sent_before[k]) / args.runs for k in sent}
        result["repeated_requests"] = repeated_requests(host)
        result["status_seconds"] = status_seconds(host)
        return result
    finally:
        host.stop()


def repeated_requests(host: Host) -> dict[str, int]:
    """Model requests asked for a turn already asked, by cause: ``provider retry`` when the
    run's timeline records a retry of that turn by the provider (an error the client
    retries within the step: expected), ``asked again`` otherwise (a turn asked a second
    time by another execution of its step). The request log goes to the kept files."""
    requests = host.model.requests()
    if host.args.keep:
        with open(host.root / "model-requests.jsonl", "w") as out:
            for r in requests:
                out.write(json.dumps({"key": r.key, "at": r.at, "position": r.position}) + "\n")
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.key] = counts.get(r.key, 0) + 1
    repeated = {key: n - 1 for key, n in counts.items() if n > 1 and key}
    with psycopg.connect(host.env["DATABASE_URL"], autocommit=True) as db:
        rows = db.execute(
            "SELECT run_id::text, data->>'step_no', data->>'turn_no' FROM runs_runevent "
            "WHERE type = 'agent.model.request.retried'"
        ).fetchall()
        recovered = db.execute(
            "SELECT coalesce(sum(recoveries), 0), coalesce(sum(retries), 0) FROM runs_run"
        ).fetchone()
    retried: dict[str, int] = {}
    for run_id, step_no, turn_no in rows:
        key = f"{run_id}:{step_no}:{turn_no}"
        retried[key] = retried.get(key, 0) + 1
    out = {"provider retry": 0, "asked again": 0}
    for key, n in repeated.items():
        by_provider = min(n, retried.get(key, 0))
        out["provider retry"] += by_provider
        out["asked again"] += n - by_provider
    # Why a turn is asked again: its step ran again, after a recovery (a lease that ran
    # out) or a retry of the step.
    out["run recoveries"], out["step retries"] = (int(v) for v in recovered or (0, 0))
    return out


def status_seconds(host: Host) -> dict[str, tuple[float, float]]:
    """How long the runs stayed in each status, median and 90th percentile in seconds
    (from the timeline's status changes): where a run's wall clock went, waiting on the
    model (planning, running, judging) or on the host (preparing, context_loading,
    verifying: CPU, CPU slots, the verify worker's processes)."""
    with psycopg.connect(host.env["DATABASE_URL"], autocommit=True) as db:
        rows = db.execute(
            "SELECT data->>'from', extract(epoch FROM created_at - lag(created_at) OVER "
            "(PARTITION BY run_id ORDER BY sequence_no)) FROM runs_runevent "
            "WHERE type = 'agent.run.status.changed'"
        ).fetchall()
    spans: dict[str, list[float]] = {}
    for status, seconds in rows:
        if seconds is not None:
            spans.setdefault(status, []).append(float(seconds))
    out = {}
    for status, values in spans.items():
        values.sort()
        out[status] = (values[len(values) // 2], values[int(len(values) * 0.9)])
    return out


def submit_all(host: Host, token: str, repository: int, n: int) -> list[int]:
    local = threading.local()

    def submit(i: int) -> int:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=host.url, timeout=60)
        body = {
            "repository": repository,
            "instruction": f"[{i}] Fix add() in calc/core.py so the tests pass.",
            "model_options": {"profile": PROFILE},
        }
        headers = {"Authorization": f"Bearer {token}"}
        return local.client.post("/api/tasks/", json=body, headers=headers).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(submit, range(n)))


def report(
    args: argparse.Namespace,
    host: Host,
    sampler: Sampler,
    before: dict[str, float],
    after: dict[str, float],
    wall: float,
    ended: dict[str, int],
    statuses: list[int],
) -> dict[str, Any]:
    cpu = {k: after[k] - before[k] for k in after}
    split = sampler.children.by_kind()
    children = cpu.pop("platform children")
    for kind in ("git", "sandbox start", "commands and tests", "other children"):
        cpu[kind] = split.get(kind, 0.0)
    cpu["children, unsampled (short-lived)"] = max(0.0, children - sum(split.values()))
    total = sum(cpu.values())
    cores = os.cpu_count() or 1
    model_time = REQUESTS_PER_RUN * args.latency
    limit = max(model_time, total / cores)
    completed = ended.get("completed", 0)
    turns = len(host.model.requests())
    own = sum(v for k, v in cpu.items() if k.startswith("Python")) + cpu["PostgreSQL"]
    own += cpu["Redis"]
    waiting = sampler.waiting
    return {
        "runs": args.runs,
        "latency_s": args.latency,
        "cores": cores,
        "accepted": sum(1 for s in statuses if 200 <= s < 300),
        "ended": ended,
        "completed": completed,
        "wall_s": wall,
        "physical_limit_s": limit,
        "one_run_model_s": model_time,
        "cpu_work_per_core_s": total / cores,
        "wall_over_limit": wall / limit,
        "waiting_peak": max(waiting, default=0),
        "waiting_mean": sum(waiting) / len(waiting) if waiting else 0.0,
        "in_flight_peak": max(sampler.in_flight, default=0),
        "connections_peak": max(sampler.connections, default=0),
        "worker_memory_peak_mb": max(sampler.memory, default=0) / 2**20,
        "worker_memory_idle_mb": sampler.memory_idle / 2**20,
        # What a run in flight adds: the peak over the idle workers, per run at the peak.
        "memory_per_run_mb": (max(sampler.memory, default=0) - sampler.memory_idle)
        / 2**20
        / max(1, max(sampler.in_flight, default=1)),
        "model_requests": turns,
        "cpu_s": cpu,
        "cpu_per_run_s": total / max(1, args.runs),
        "platform_cpu_per_turn_ms": 1000 * own / max(1, turns),
        "lost_or_faulted": args.runs - completed,
    }


TARGETS = [
    ("runs waiting on the model, peak", "waiting_peak", ">=", 150, ""),
    ("wall clock / physical limit", "wall_over_limit", "<=", 1.5, "x"),
    ("runs completed", "completed", ">=", 200, ""),
    ("PostgreSQL connections, peak", "connections_peak", "<=", 30, ""),
    ("worker memory, peak (PSS)", "worker_memory_peak_mb", "<=", 1536, "MB"),
    ("whole-machine CPU per run", "cpu_per_run_s", "<=", 0.75, "s"),
    ("runs lost or ended by faults", "lost_or_faulted", "<=", 0, ""),
]


def render(result: dict[str, Any]) -> str:
    lines = [
        f"N={result['runs']} runs, L={result['latency_s']} s, {result['cores']} cores: "
        f"wall {result['wall_s']:.1f} s against a physical limit of "
        f"{result['physical_limit_s']:.1f} s (one run's model time "
        f"{result['one_run_model_s']:.0f} s; CPU work / cores "
        f"{result['cpu_work_per_core_s']:.1f} s)",
        f"runs waiting on the model: peak {result['waiting_peak']}, mean "
        f"{result['waiting_mean']:.1f}; runs in flight, peak {result['in_flight_peak']}",
        f"worker memory {result['worker_memory_peak_mb']:.0f} MB at the peak "
        f"({result['worker_memory_idle_mb']:.0f} MB idle), "
        f"{result['memory_per_run_mb']:.1f} MB more per run in flight",
        f"platform CPU per model turn (Python, PostgreSQL, Redis): "
        f"{result['platform_cpu_per_turn_ms']:.1f} ms over {result['model_requests']} requests",
        f"ended: {result['ended']}; the rest of the machine was busy on "
        f"{result.get('other_load_cores', 0):.2f} cores meanwhile: on the cores left, the "
        f"limit was {result.get('limit_on_cores_left_s', 0):.1f} s",
        "per run: " + ", ".join(f"{k} {v:.0f}" for k, v in result.get("per_run", {}).items()),
        "time in each status, median / p90 s: "
        + ", ".join(
            f"{k} {m:.1f} / {p:.1f}" for k, (m, p) in result.get("status_seconds", {}).items()
        ),
        "model requests repeating a turn: "
        + ", ".join(f"{k} {v}" for k, v in result.get("repeated_requests", {}).items()),
        "CPU per run, where it goes: "
        + ", ".join(f"{k} {v / result['runs']:.3f} s" for k, v in result["cpu_s"].items()),
        "",
        "| figure | measured | target | met |",
        "|---|---|---|---|",
    ]
    # The targets are set for N = 200; smaller runs are judged on the share.
    scale = result["runs"] / 200
    for name, key, op, bound, unit in TARGETS:
        value = result[key]
        bound_here = bound * scale if key in ("waiting_peak", "completed") else bound
        met = value >= bound_here if op == ">=" else value <= bound_here
        lines.append(
            f"| {name} | {value:.2f}{unit} | {op} {bound_here:g}{unit} | "
            f"{'met' if met else 'missed'} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--latency", type=float, default=5.0)
    parser.add_argument("--agent-threads", type=int, default=layout.AGENT_THREADS)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--keep", action="store_true", help="keep the logs and data")
    parser.add_argument("--json", action="store_true")
    return parser


def from_bench(table: Any, *, tiny: bool, extra: str) -> None:
    """``make bench --only inflight``: this benchmark in a process of its own (it starts
    its own services and settings), its report added to the table's notes."""
    sizes = ["--runs", "10", "--latency", "1"] if tiny else []
    argv = [sys.executable, "-m", "bench.inflight", *sizes, *extra.split()]
    print(f"[bench] inflight: {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    table.notes.append("runs in flight (bench.inflight):\n" + done.stdout.strip())
    if done.returncode:
        raise RuntimeError(f"bench.inflight failed: {done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> str:
    args = parser().parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the services and processes it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    result = measure(args)
    text = json.dumps(result) if args.json else render(result)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
