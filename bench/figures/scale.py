"""Figure 6: lease acquisition, admission and WAL per submission over a database of
many finished runs, against the same at the smallest size."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench.environment import database_drop, database_recreate
from bench.fill import finished_fill
from bench.harness import Bench
from bench.table import Figure, say


def scale_measure(bench: Bench) -> None:
    """Lease acquisition and admission over a database grown to each of the sizes,
    each size taking turns with the smallest one: a copy of the database made when it
    held the smallest size (``database_copy``). Measured minutes apart, the two met a
    machine whose speed had moved by more than the target's margin (the 1,000,000-run
    figure at 1.60x in one run, 1.01x when measured again alone)."""
    sizes = [1_000, 5_000] if bench.tiny else bench.args.scale_sizes
    say(f"scale: lease acquisition and admission at {sizes} finished runs")
    # The first fill may step a real run to copy: before wake-ups are switched off.
    finished_fill(bench, sizes[0])
    small, large = sizes[0], sizes[-1]
    main = bench.env["BENCH_DATABASE"]
    copy = f"{main}_small"
    # Nothing consumes these wake-ups here: what is timed is the database work.
    from runs import dispatch

    original = dispatch.run_wake
    dispatch.run_wake = lambda **kwargs: None
    # Per size: its turns' medians, and those of the smallest size's turns with it.
    measured: dict[int, dict[str, list[float]]] = {}
    try:
        database_copy(bench, copy)
        with database_named(bench, copy):
            bench.database_settle()
        for size in sizes[1:]:
            finished_fill(bench, size)
            got = measured[size] = {"lease": [], "admit": [], "lease_at": [], "admit_at": []}
            for rep in range(bench.reps):
                sides = [("", main), ("_at", copy)]
                for suffix, database in sides if rep % 2 == 0 else sides[::-1]:
                    with database_named(bench, database):
                        lease, admit = scale_turn(bench)
                    got["lease" + suffix].append(lease)
                    got["admit" + suffix].append(admit)
            say(
                f"scale {size:,}: lease {statistics.median(got['lease']):.2f} ms, "
                f"admission {statistics.median(got['admit']):.2f} ms; in turns with it, "
                f"{small:,}: lease {statistics.median(got['lease_at']):.2f} ms, "
                f"admission {statistics.median(got['admit_at']):.2f} ms"
            )
        wal = wal_per_submission(bench, 50 if bench.tiny else 300)
    finally:
        dispatch.run_wake = original
        database_drop(bench.env, copy)
    scale_table_add(bench, measured[large], wal, small=small, large=large)


def scale_table_add(
    bench: Bench,
    figures: dict[str, list[float]],
    wal: dict[str, list[float]],
    *,
    small: int,
    large: int,
) -> None:
    """Figure 6's rows: the largest size against the smallest, measured in turns."""
    bench.table.add(
        Figure(
            f"6. lease acquisition, {large:,} finished runs",
            "ms",
            figures["lease"],
            figures["lease_at"],
            f"same at {small:,}, in turns",
            "<= 1.3x",
        )
    )
    bench.table.add(
        Figure(
            f"6. admission (task_submit), {large:,} finished runs",
            "ms",
            figures["admit"],
            figures["admit_at"],
            f"same at {small:,}, in turns",
            "<= 1.3x",
        )
    )
    bench.table.add(
        Figure(
            f"6. WAL per submission after a checkpoint, {large:,} finished runs",
            "kB",
            wal["wal"],
            wal["wal_random"],
            "same, random UUIDv4 ids",
        )
    )
    bench.table.add(
        Figure(
            f"6. submission after a checkpoint, {large:,} finished runs",
            "ms",
            wal["ms"],
            wal["ms_random"],
            "same, random UUIDv4 ids",
        )
    )


def scale_turn(bench: Bench, timed: int = 30, untimed: int = 5) -> tuple[float, float]:
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
            workspace=bench.workspace, repository=bench.repository, instruction="bench"
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


def database_copy(bench: Bench, name: str) -> None:
    """``name`` (dropped first) as a copy of the benchmark's database as it is now.
    PostgreSQL copies a database only while no one else is connected to it: this
    process's connections are closed first, and any left by a stopped child ended."""
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(bench.env["BENCH_ADMIN_URL"], autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            [bench.env["BENCH_DATABASE"]],
        )
    database_recreate(bench.env, name, template=bench.env["BENCH_DATABASE"])


@contextmanager
def database_named(bench: Bench, name: str) -> Iterator[None]:
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


def wal_per_submission(bench: Bench, count: int) -> dict[str, list[float]]:
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
        for _ in range(bench.reps):
            for random_ids in (False, True):
                ids.uuid7 = uuid.uuid4 if random_ids else time_ordered
                with connection.cursor() as cursor:
                    cursor.execute("CHECKPOINT")
                    cursor.execute("SELECT pg_current_wal_lsn()")
                    (start,) = cursor.fetchone()
                began = time.perf_counter()
                made = [
                    task_submit(
                        workspace=bench.workspace,
                        repository=bench.repository,
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
