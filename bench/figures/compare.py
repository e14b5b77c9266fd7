"""Figures 4 and 5 of this tree against another revision's (``--only compare``)."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.environment import GITHUB_SECRET, git_run
from bench.figures.web import api_token, measure, ping_body, server
from bench.fill import reads_fixture
from bench.harness import Bench
from bench.table import Figure, say


def compare_measure(bench: Bench) -> None:
    """Figures 4 and 5 of this tree against those of another revision (``--against``),
    in one run (not in the default run): a server of each, taking turns on the same
    database, broker and connections, each figure against its own one-INSERT view as
    figures 4 and 5 measure it. The machine's drift, which moves a figure between
    runs by more than most changes do, is then the same for both. The other
    revision is checked out in a temporary git worktree and served with this tree's
    environment; it runs on the schema this tree migrated, so it is for changes that
    leave the schema as it is."""
    against = bench.args.against
    seconds = 1.0 if bench.tiny else bench.args.seconds
    token = api_token(bench)
    body = ping_body(bench)
    reads_fixture(bench)  # figure 5's database
    revision = git_run("rev-parse", "--short", against)
    here = git_run("rev-parse", "--short", "HEAD")
    if git_run("status", "--porcelain", "--untracked-files=no"):
        here += " and changes"
    there = against if revision.startswith(against) else f"{against} ({revision})"
    labels = {"here": f"this tree ({here})", "there": there}
    kinds = {
        "submit": ("5. POST /api/tasks/", {"token": token, "repository": bench.repository.pk}),
        "webhook": ("4. webhook intake", {"secret": GITHUB_SECRET, "body_file": body}),
    }
    measured: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        (side, kind): ([], []) for side in labels for kind in kinds
    }
    say(f"compare: this tree against {against} ({revision}), {seconds:.0f} s per figure")
    with tempfile.TemporaryDirectory(prefix="agentplatform-compare-") as scratch:
        tree = Path(scratch) / "tree"
        git_run("worktree", "add", "--detach", str(tree), revision)
        try:
            with ExitStack() as servers:
                ports = {
                    "here": servers.enter_context(server(bench, "asgi")),
                    "there": servers.enter_context(server(bench, "asgi", tree=tree)),
                }
                for rep in range(bench.reps):
                    bench.quiesce()
                    bench.database_settle()
                    sides = list(labels) if rep % 2 == 0 else list(labels)[::-1]
                    for side in sides:
                        for kind, (_, extra) in kinds.items():
                            baseline, figure = measure(
                                bench, ports[side], kind, 32, seconds, **extra
                            )
                            measured[side, kind][0].append(figure["rps"])
                            measured[side, kind][1].append(baseline["rps"])
        finally:
            git_run("worktree", "remove", "--force", str(tree))
    for kind, (name, _) in kinds.items():
        for side, label in labels.items():
            values, baselines = measured[side, kind]
            bench.table.add(
                Figure(f"{name}, {label}", "req/s", values, baselines, "one-INSERT view, asgi")
            )
