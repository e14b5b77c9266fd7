"""Cost of observability on the hot paths, against baselines measured in the same run.

1. A log line through the production pipeline (context variables, JSON, traceback
   rendering, secret redaction with 50 registered secrets) against the same line through
   the pipeline without traceback rendering and redaction.
2. A counter increment in multiprocess mode (memory-mapped file shared by every process)
   against an in-process counter.

    .venv/bin/python bench/bench_observability.py
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="bench-metrics-"))

import django

django.setup()

import structlog  # noqa: E402
from prometheus_client import CollectorRegistry, values  # noqa: E402
from prometheus_client.metrics import Counter  # noqa: E402

from agentplatform.logging import (  # noqa: E402
    _SHARED_PROCESSORS,
    StructuredFormatter,
    secrets_register,
)
from jobs import metrics as _store  # noqa: E402, F401 - the multiprocess store

N = int(os.environ.get("BENCH_LINES", "20000"))
REPS = int(os.environ.get("BENCH_REPS", "5"))


def _rate(fn, n: int) -> float:
    started = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - started)


def _logger(formatter: logging.Formatter) -> logging.Logger:
    logger = logging.getLogger(f"bench.{id(formatter)}")
    logger.propagate = False
    logger.handlers = []
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger


def bench_logging() -> tuple[float, float]:
    secrets_register([f"registered-secret-{i:04d}-value" for i in range(50)])
    structlog.contextvars.bind_contextvars(
        request_id="0" * 32, run_id="r" * 36, task_id="t" * 36, trace_id="a" * 32
    )
    ours = structlog.wrap_logger(_logger(StructuredFormatter(json=True)))
    # The pipeline before tracebacks and redaction: context, level, name, time, JSON.
    bare_formatter = structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
        foreign_pre_chain=list(_SHARED_PROCESSORS),
    )
    bare = structlog.wrap_logger(_logger(bare_formatter))

    def emit(logger):
        def run(n: int) -> None:
            for i in range(n):
                logger.info(
                    "step.committed", run_id="x", step_no=i, source="running", target="verifying"
                )

        return run

    pipeline = [_rate(emit(ours), N) for _ in range(REPS)]
    baseline = [_rate(emit(bare), N) for _ in range(REPS)]
    return sorted(pipeline)[REPS // 2], sorted(baseline)[REPS // 2]


def bench_counters() -> tuple[float, float]:
    shared = Counter("bench_shared", "multiprocess", ["label"], registry=CollectorRegistry())
    local_class = values.MutexValue
    saved = values.ValueClass
    values.ValueClass = local_class
    try:
        local = Counter("bench_local", "in-process", ["label"], registry=CollectorRegistry())
    finally:
        values.ValueClass = saved

    def inc(counter):
        def run(n: int) -> None:
            child = counter.labels("a")
            for _ in range(n):
                child.inc()

        return run

    ours = [_rate(inc(shared), N * 10) for _ in range(REPS)]
    base = [_rate(inc(local), N * 10) for _ in range(REPS)]
    return sorted(ours)[REPS // 2], sorted(base)[REPS // 2]


def main() -> None:
    lines, lines_base = bench_logging()
    incs, incs_base = bench_counters()
    print(f"{'measurement':<44}{'ours/s':>12}{'baseline/s':>14}{'ratio':>8}")
    print(
        f"{'log line (JSON + context + redaction)':<44}{lines:>12,.0f}{lines_base:>14,.0f}"
        f"{lines / lines_base:>8.2f}"
    )
    print(
        f"{'counter inc (multiprocess mmap)':<44}{incs:>12,.0f}{incs_base:>14,.0f}"
        f"{incs / incs_base:>8.2f}"
    )


if __name__ == "__main__":
    main()
