"""Figures 4 and 5: webhook intake, task submission and reads over HTTP, each against
the one-INSERT view taking turns with it on the same server."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.environment import GITHUB_SECRET, PY, ROOT, free_port, wait_for
from bench.fill import reads_fixture
from bench.harness import Bench
from bench.table import Figure, say


@contextmanager
def server(
    bench: Bench,
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
    child = bench.procs.start(f"web-{layout}", argv, cwd=tree, **env)
    import socket

    def up() -> bool:
        if child.poll() is not None:
            raise RuntimeError(f"web {layout} exited; see {bench.logdir}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_for(up, 60, f"web {layout}", every=0.1)
    load(bench, port, "insert", conns=4, seconds=1)  # warm every worker process
    try:
        yield port
    finally:
        bench.procs.stop(child)


def load(bench: Bench, port: int, kind: str, conns: int, seconds: float, **extra: Any) -> dict:
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
    out = subprocess.run(argv, cwd=ROOT, env=bench.env, capture_output=True, check=True)
    return json.loads(out.stdout)


def measure(
    bench: Bench, port: int, kind: str, conns: int, seconds: float, **extra: Any
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
    warm = 0.3 if bench.tiny else 1.0
    load(bench, port, kind, conns=4, seconds=warm, **extra)
    turns = load(
        bench,
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


def ping_body(bench: Bench) -> Path:
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


def api_token(bench: Bench) -> str:
    from django.contrib.auth import get_user_model

    from agentplatform.api.auth import api_token_issue
    from runs.models import Membership

    user, _ = get_user_model().objects.get_or_create(username="bench")
    Membership.objects.get_or_create(
        workspace=bench.workspace, user=user, defaults={"role": "admin"}
    )
    return api_token_issue(user=user, name="bench")[1]


def web_measure(bench: Bench) -> None:
    seconds = 1.0 if bench.tiny else bench.args.seconds
    conns = 32
    say(f"web: {conns} connections, {seconds:.0f} s per figure")
    body = ping_body(bench)
    token = api_token(bench)
    layout = bench.args.layout
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
    run_path = reads_fixture(bench)
    for rep in range(bench.reps):
        if rep:
            # Each repetition starts where the first did, as each figure does: the
            # runs the last one's submissions queued (nothing steps them here) are
            # ended. Left queued, they made every later repetition's admission count
            # thousands more active runs than the first one's.
            bench.quiesce()
            bench.database_settle()
        with server(bench, layout) as port:

            def pair(name: str, kind: str, **extra: Any) -> None:
                baseline, figure = measure(bench, port, kind, conns, seconds, **extra)
                figures["insert"].append(baseline)
                figures[f"insert_{name}"].append(baseline)
                figures[name].append(figure)

            pair("webhook", "webhook", secret=GITHUB_SECRET, body_file=body)
            pair("submit", "submit", token=token, repository=bench.repository.pk)
            pair("api_layer", "api-layer", token=token, repository=bench.repository.pk)
            figures["webhook64"].append(
                load(bench, port, "webhook", 64, seconds, secret=GITHUB_SECRET, body_file=body)
            )
            pair("runs", "get", token=token, path="/api/runs/")
            pair("events", "get", token=token, path=run_path)
        with server(bench, "wsgi") as port:
            figures["wsgi_insert"].append(load(bench, port, "insert", conns, seconds))
    web_table_add(bench, figures, layout=bench.args.layout)


def web_table_add(bench: Bench, figures: dict[str, list[Any]], *, layout: str) -> None:
    """Figures 4 and 5 from what ``web_measure`` measured, each over its baseline."""
    rps = lambda k: [r["rps"] for r in figures[k]]  # noqa: E731
    ms = lambda k, p: [r[p] for r in figures[k]]  # noqa: E731
    errors = lambda k: [r["errors"] for r in figures[k]]  # noqa: E731
    base = f"one-INSERT view, {layout}"

    def add(name: str, unit: str, values: list, baseline: list, target: str = "") -> None:
        bench.table.add(Figure(name, unit, values, baseline, base if baseline else "", target))

    add("4. webhook intake (32 conns)", "req/s", rps("webhook"), rps("insert_webhook"), ">= 0.6")
    add("4. webhook intake p50", "ms", ms("webhook", "p50_ms"), ms("insert_webhook", "p50_ms"))
    add("4. webhook intake p99", "ms", ms("webhook", "p99_ms"), ms("insert_webhook", "p99_ms"))
    bench.table.add(
        Figure(
            f"4. one-INSERT view, production layout ({layout})",
            "req/s",
            rps("insert"),
            rps("wsgi_insert"),
            "same view, gunicorn sync",
            ">= 0.6",
        )
    )
    add("4. webhook errors (5xx/io) at 64 conns, defaults", "", errors("webhook64"), [], "0")
    add("4. webhook errors at 32 conns", "", errors("webhook"), [], "0")
    add("5. POST /api/tasks/ (32 conns)", "req/s", rps("submit"), rps("insert_submit"), ">= 0.4")
    add("5.   its API layer over one INSERT", "req/s", rps("api_layer"), rps("insert_api_layer"))
    runs = f"5. GET /api/runs/ over {bench.read_runs:,} runs"
    add(runs, "req/s", rps("runs"), rps("insert_runs"), ">= 0.5")
    add("5. GET a run's events", "req/s", rps("events"), rps("insert_events"), ">= 0.5")
    by_figure = {
        k: sum(r["errors"] for r in v)
        for k, v in figures.items()
        if not k.startswith("insert_")  # each also in "insert"
    }
    bench.table.notes.append(f"web errors by figure: {by_figure}")
