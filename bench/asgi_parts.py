"""The web entry point with one part of a task submission made free, for ``bench.run
--only parts``: what the submission figure (5) would be without that part.

``BENCH_FREE`` names the part; empty, the server is the product's own.

- ``statement``: the one statement that takes an admission lane, counts and writes the
  task, its run and their events (nothing is written; the answer is the same).
- ``round_trip``: the commit's Redis round trip (the run's wake-up, the relay's, the live
  views'); every message is still built.
- ``message``: Celery's building and sending of the run's wake-up message; the round
  trip still goes with the relay's commands.

Only the benchmark starts this module; the answers of a server with a part made free
describe no durable work.
"""

import os

from agentplatform.asgi import application

FREE = os.environ.get("BENCH_FREE", "")

if FREE == "statement":
    from runs import services

    services._submission_insert_admitting = lambda **kwargs: True  # type: ignore[assignment]
elif FREE == "round_trip":
    from jobs import redis_round

    redis_round._execute = lambda client, sends, *, raising: None  # type: ignore[assignment]
elif FREE == "message":
    from runs import dispatch

    dispatch.run_wake = lambda **kwargs: None  # type: ignore[assignment]
elif FREE:
    raise SystemExit(f"BENCH_FREE: unknown part {FREE!r}")

__all__ = ["application"]
