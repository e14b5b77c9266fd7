"""The database the read and scale figures are measured on: finished runs cloned in
PostgreSQL from one real run."""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Bench
from bench.table import say

FILL_WORKSPACES = 10


# What each fill chunk clones from the template run (``m``: the chunk's new keys, one
# row per run): each table's column overrides, which template rows, and the template
# key the statement takes (its task's, its own, none).
FILL_CLONES: list[tuple[str, dict[str, str], str, str]] = [
    (
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
        "task",
    ),
    (
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
        "run",
    ),
    (
        "runs_runevent",
        {
            "id": "gen_random_uuid()",
            "run_id": "m.rid",
            "created_at": "m.created + t.sequence_no * interval '10 s'",
        },
        "t.run_id = %s AND t.sequence_no <= m.nev",
        "run",
    ),
    (
        "jobs_outboxevent",
        {
            "id": "nextval('jobs_outboxevent_id_seq')",
            "event_id": "gen_random_uuid()",
            "partition_key": "m.rid::text",
            "created_at": "m.created",
            "published_at": "m.created + interval '1 second'",
        },
        "t.id = (SELECT min(id) FROM jobs_outboxevent)",
        "",
    ),
]


def finished_fill(bench: Bench, total: int) -> None:
    """Finished runs up to ``total``, made in PostgreSQL (INSERT ... SELECT over
    generate_series), cloned from one real finished run so every column is one the
    platform wrote.

    The history looks like a service's: half the runs belong to the benchmark's
    workspace and the rest to nine others, created over the last 90 days; 80 %
    completed, 12 % failed, 6 % cancelled, 2 % timed out; each with 2-9 of the
    template run's events and one published outbox row.
    """
    from django.db import connection

    from runs.models import Run

    have = Run.objects.count()
    if have >= total:
        return
    template = fill_template(bench)
    say(f"filling to {total:,} finished runs")
    started = time.monotonic()
    # Repository i of the list (0: the benchmark's) for half the runs and the others
    # in turn; status by share; creation over 90 days; how many events. (``%%``: the
    # statement has parameters.)
    repos = [r.pk for r in bench.fill_repositories]
    spaces = [r.workspace_id for r in bench.fill_repositories]
    n_others = len(repos) - 1
    pick = f"CASE WHEN g %% 2 = 0 THEN 0 ELSE 1 + (g / 2) %% {n_others} END"
    status = (
        "CASE WHEN g %% 50 < 40 THEN 'completed' WHEN g %% 50 < 46 THEN 'failed' "
        "WHEN g %% 50 < 49 THEN 'cancelled' ELSE 'timed_out' END"
    )
    keys = {"task": [template.task_id], "run": [template.pk], "": None}
    statements = [(_clone(table, o, where), keys[key]) for table, o, where, key in FILL_CLONES]
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
                for statement, params in statements:
                    cursor.execute(statement, params)
                have += n
            cursor.execute("DROP TABLE IF EXISTS m")
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
            cursor.execute("SET synchronous_commit = DEFAULT")
    # A service's tables of finished rows are vacuumed by autovacuum (off on some
    # machines): without it the visibility map of the freshly filled tables is empty
    # and every index-only scan reads the table too.
    bench.database_settle()
    took = time.monotonic() - started
    say(f"filled to {have:,} runs in {took:.0f} s")
    bench.table.notes.append(f"fill to {have:,} finished runs: {took:.0f} s")


def fill_template(bench: Bench) -> Any:
    """The finished run every fill clones (one is stepped if there is none), and the
    repositories of the fill's nine other workspaces, made once per benchmark."""
    from runs.models import Repository, Run, Workspace

    if getattr(bench, "fill_template", None) is None:
        template = Run.objects.filter(status="completed").order_by("created_at").first()
        if template is None:
            bench.m_steps_minimal()
            template = Run.objects.filter(status="completed").first()
        bench.fill_template = template
        others = []
        for i in range(FILL_WORKSPACES - 1):
            workspace = Workspace.objects.create(slug=f"fill-{i}", name=f"fill {i}")
            others.append(
                Repository.objects.create(
                    workspace=workspace, name=f"fill-{i}", clone_url="/dev/null"
                )
            )
        bench.fill_repositories = [bench.repository, *others]
    return bench.fill_template


def _columns(table: str) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position",
            [table],
        )
        return [c for (c,) in cursor.fetchall()]


def _clone(table: str, overrides: dict[str, str], where: str) -> str:
    """INSERT ... SELECT of ``table``'s template rows once per row of ``m``."""
    cols = _columns(table)
    select = ", ".join(overrides.get(c, f"t.{c}") for c in cols)
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) SELECT {select} FROM {table} t, m WHERE {where}"
    )


def reads_fixture(bench: Bench) -> str:
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

    bench.read_runs = 2_000 if bench.tiny else bench.args.read_runs
    finished_fill(bench, bench.read_runs)
    bench.read_runs = Run.objects.count()
    # One of the benchmark workspace's own runs: the fill gives others to nine more.
    run = (
        Run.objects.filter(status="completed", task__repository=bench.repository)
        .order_by("created_at")
        .first()
    )
    return f"/api/runs/{run.pk}/events/"
