"""The benchmark harness runs (tiny sizes): its figures are not asserted, only produced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench_tiny(only: str, *extra: str) -> str:
    """The table of ``bench.run`` at tiny sizes, one repetition, of the figures ``only``."""
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--reps", "1", "--only", only, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.services
@pytest.mark.slow
def test_bench_runs_with_tiny_sizes() -> None:
    table = _bench_tiny("steps,relay")
    for label in ("1. step throughput", "9. relay tasks per run", "3. relay publish"):
        assert label in table
    # Every figure that has a baseline got a ratio.
    assert "| -     | >= 0.5" not in table


@pytest.mark.services
@pytest.mark.slow
def test_bench_scale_takes_turns_with_a_copy_of_the_small_database() -> None:
    import psycopg

    from bench.environment import bench_environment

    table = _bench_tiny("scale")
    rows = [line for line in table.splitlines() if line.startswith("| 6. ")]
    assert any("lease acquisition, 5,000 finished runs" in row for row in rows)
    assert all("in turns" in row for row in rows if "lease" in row or "admission" in row)
    env = bench_environment()
    with psycopg.connect(env["BENCH_ADMIN_URL"], autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s",
            [env["BENCH_DATABASE"] + "%"],
        ).fetchall()
    # The copy is gone; the benchmark's own database stays, as every figure leaves it.
    assert [name for (name,) in left if name != env["BENCH_DATABASE"]] == []


@pytest.mark.services
@pytest.mark.slow
def test_bench_parts_measures_each_part_made_free() -> None:
    table = _bench_tiny("parts")
    # On figure 5's database: finished runs, analysed (bench.fill.reads_fixture).
    assert "- fill to " in table
    rows = [line for line in table.splitlines() if "POST /api/tasks/," in line]
    assert len(rows) == 4
    for line in rows:
        # Each has its one-INSERT baseline and a ratio: its server answered submissions.
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[3].endswith("(one-INSERT view, asgi)")
        assert float(cells[4]) > 0


@pytest.mark.services
@pytest.mark.slow
def test_bench_compare_measures_this_tree_and_the_other_revision() -> None:
    from bench.environment import git_run

    worktrees = git_run("worktree", "list")
    table = _bench_tiny("compare", "--against", "HEAD")
    assert "- fill to " in table  # figure 5's database
    rows = [line for line in table.splitlines() if line.startswith(("| 4. webhook", "| 5. POST"))]
    assert len(rows) == 4
    for label in (
        "5. POST /api/tasks/, this tree (",
        "5. POST /api/tasks/, HEAD (",
        "4. webhook intake, this tree (",
        "4. webhook intake, HEAD (",
    ):
        (line,) = [row for row in rows if row.startswith(f"| {label}")]
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        # Each server answered its figure and the one-INSERT view taking turns with it.
        assert cells[3].endswith("(one-INSERT view, asgi)")
        assert float(cells[4]) > 0
    # The other revision's checkout is gone with the run.
    assert git_run("worktree", "list") == worktrees


def test_bench_compare_needs_a_revision() -> None:
    from bench.run import main

    with pytest.raises(SystemExit) as stopped:
        main(["--only", "compare"])
    assert stopped.value.code == 2  # argparse's usage error, before anything starts


def test_bench_refuses_a_figure_it_does_not_know() -> None:
    from bench.run import main

    with pytest.raises(SystemExit) as stopped:
        main(["--only", "steps,no-such-figure"])
    assert stopped.value.code == 2  # argparse's usage error, before anything starts


def test_bench_compare_names_a_revision_git_does_not_know() -> None:
    from bench.environment import git_run

    with pytest.raises(SystemExit, match="git rev-parse no-such-rev:"):
        git_run("rev-parse", "no-such-rev")


@pytest.mark.services
def test_an_unknown_part_stops_the_parts_server() -> None:
    env = {**os.environ, "BENCH_FREE": "everything", "DJANGO_SETTINGS_MODULE": "bench.settings"}
    result = subprocess.run(
        [sys.executable, "-c", "import bench.asgi_parts"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "unknown part 'everything'" in result.stderr


def test_bench_judges_targets_on_unrounded_figures() -> None:
    from bench.table import Figure, Table

    # 513 / 1,296 prints as 0.40 but is 0.396: short of ">= 0.4".
    short = Figure("5. submissions", "req/s", [513.0], [1296.0], "view", ">= 0.4")
    assert short.row()[4:] == ["0.40", ">= 0.4", "no"]
    assert Figure("5. x", "req/s", [520.0], [1296.0], "view", ">= 0.4").met() is True
    # A unit other than x bounds the median, with or without a baseline.
    assert Figure("2. p99", "ms", [19.9], [3.0], "raw", "< 20 ms").met() is True
    assert Figure("2. p99", "ms", [20.0], [3.0], "raw", "< 20 ms").met() is False
    idle = Figure("7. idle", "CPU-s/min", [0.33], [0.24], "loop", "< 0.6 CPU-s/min (1%)")
    assert idle.met() is True  # its ratio, 1.38, is not what the target bounds
    assert Figure("2. p50", "ms", [5.0], [2.4], "raw", "<= 2x").met() is False
    assert Figure("9. relay", "", [3.0], target="<= 3").met() is True
    assert Figure("4. errors", "", [0.0], target="0").met() is True
    assert Figure("4. errors", "", [1.0], target="0").met() is False
    assert Figure("10. conns", "", [0.004], target="~0").met() is True
    assert Figure("10. conns", "", [0.2], target="~0").met() is False
    assert Figure("9. consumers", "", [0.1]).met() is None
    table = Table()
    table.figures = [short, idle, Figure("9. consumers", "", [0.1])]
    assert "- targets met: 1 of 2; missed: 5. submissions" in table.render()


@pytest.mark.services
@pytest.mark.slow
def test_bench_inflight_reports_each_figure_against_its_target() -> None:
    table = _bench_tiny("inflight")
    for label in (
        "runs waiting on the model, peak",
        "wall clock / physical limit",
        "PostgreSQL connections, peak",
        "whole-machine CPU per run",
        "CPU per run, where it goes: Python: web",
    ):
        assert label in table
    assert "| runs completed | 10.00 | >= 10 | met |" in table
