"""Where a submission's cost goes (``--only parts``): figure 5 with one part of the
submission made free (``bench.asgi_parts``)."""

from __future__ import annotations

from contextlib import ExitStack

from bench.figures.web import api_token, measure, server
from bench.fill import reads_fixture
from bench.harness import Bench
from bench.table import Figure, say

# What ``--only parts`` makes free in turn (bench.asgi_parts), and how the table says it.
SUBMISSION_PARTS = {
    "": "as it is",
    "statement": "its one statement free",
    "round_trip": "its Redis round trip free",
    "message": "its run's Celery message free",
}


def parts_measure(bench: Bench) -> None:
    """Where a submission's cost goes (not in the default run): figure 5's
    submissions against the one-INSERT view, on servers that are the product's except
    for one part of the submission, made free (``bench.asgi_parts``). A part's share
    is how far the ratio rises without it. Every server runs from the start; the
    parts take turns, in reverse order every other repetition, each repetition on a
    settled database as figure 5's."""
    seconds = 1.0 if bench.tiny else bench.args.seconds
    token = api_token(bench)
    reads_fixture(bench)  # figure 5's database
    submissions: dict[str, list[float]] = {part: [] for part in SUBMISSION_PARTS}
    baselines: dict[str, list[float]] = {part: [] for part in SUBMISSION_PARTS}
    say(f"parts: {len(submissions)} servers, {seconds:.0f} s per figure")
    with ExitStack() as servers:
        ports = {
            part: servers.enter_context(
                server(bench, "asgi", application="bench.asgi_parts:application", BENCH_FREE=part)
            )
            for part in SUBMISSION_PARTS
        }
        for rep in range(bench.reps):
            # Each repetition starts where figure 5's do: no queued runs, a settled
            # database.
            bench.quiesce()
            bench.database_settle()
            order = list(SUBMISSION_PARTS)
            for part in order if rep % 2 == 0 else order[::-1]:
                baseline, figure = measure(
                    bench,
                    ports[part],
                    "submit",
                    32,
                    seconds,
                    token=token,
                    repository=bench.repository.pk,
                )
                baselines[part].append(baseline["rps"])
                submissions[part].append(figure["rps"])
    for part, label in SUBMISSION_PARTS.items():
        bench.table.add(
            Figure(
                f"5. POST /api/tasks/, {label}",
                "req/s",
                submissions[part],
                baselines[part],
                "one-INSERT view, asgi",
            )
        )
