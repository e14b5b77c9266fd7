"""The fault scenarios. Each drives load into a workspace of its own, injects its faults,
waits for the work to drain and hands the workspace to the invariant checks.

Sizes come from a profile: ``light`` (inside ``make test``: few runs, the scenarios that
catch the most) and ``full`` (``make chaos``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

from tests.chaos import invariants
from tests.chaos.checks import (
    accept_rate,
    beat_sends,
    beat_starts,
    double_fires,
    fuzz,
    outsider_leaks,
    outsider_probes,
)
from tests.chaos.invariants import db
from tests.chaos.load import Load, github_headers, scope_create
from tests.chaos.profiles import Profile, Result
from tests.chaos.services import Child
from tests.chaos.stack import WEBHOOK_SECRET, Stack


class Harness:
    def __init__(self, stack: Stack, profile: Profile, seed: int) -> None:
        self.stack = stack
        self.profile = profile
        self.rng = random.Random(seed)
        self.recovery_marks: list[tuple[list[str], float]] = []
        self.pending_threads: list[threading.Thread] = []
        # Verdicts that wait for a window (two beats up together) to close, and may let
        # a scenario that needs no work of its own (idle) run inside that window.
        self.open_windows: list[Callable[[], None]] = []

    def settle(self) -> None:
        """Close every open window and complete its scenario's verdict."""
        while self.open_windows:
            self.open_windows.pop(0)()

    def load(self, name: str, **kwargs: Any) -> Load:
        scope = db(lambda: scope_create(self.stack, f"chaos-{name}", **kwargs))
        return Load(self.stack, scope)

    def mark_fault(self, load: Load, at: float | None = None) -> None:
        """Remember the runs a fault interrupts, to time their recovery afterwards."""
        runs = db(lambda: invariants.active_runs(load.scope.workspace_id))
        self.recovery_marks.append((runs, at if at is not None else time.time()))

    def finish(
        self,
        result: Result,
        load: Load,
        started: float,
        exits_before: int,
        bound: float | None = None,
    ) -> Result:
        # Requests sent during an outage may still be waiting for their answer.
        for thread in self.pending_threads:
            thread.join(timeout=60)
        self.pending_threads.clear()
        bound = bound or self.profile.drain_bound
        drain = invariants.wait_drained(load, bound, self.stack.supervise)
        result.notes.append(f"drained {drain:.0f}s after the load")
        if drain >= bound:
            state = db(lambda: invariants.progress(load))
            result.notes.append(f"not drained after {drain:.0f}s: {state}")
        exits = self.stack.unexpected_exits()[exits_before:]
        result.absorb(invariants.check(load, exits=exits))
        for runs, at in self.recovery_marks:
            seconds = db(partial(invariants.recovery_seconds, runs, at))
            result.recovery = max(result.recovery, seconds)
        self.recovery_marks.clear()
        result.seconds = time.monotonic() - started
        return result

    # Arrivals during a fault come at most this often per kind: a platform that keeps
    # answering fast while Redis is down would otherwise take hundreds of deliveries a
    # second from the loop (each one an issue task), far beyond the load the scenario
    # is sized for.
    ARRIVAL_INTERVAL = 0.1

    @contextmanager
    def arrivals(self, load: Load) -> Iterator[None]:
        """Submissions and deliveries keep arriving (from two threads, each at most every
        ``ARRIVAL_INTERVAL``) while the block runs; the block ends on time however long
        the requests hang."""
        stop = threading.Event()

        def send(action: Callable[[], Any]) -> None:
            while not stop.is_set():
                began = time.monotonic()
                action()
                stop.wait(max(0.0, self.ARRIVAL_INTERVAL - (time.monotonic() - began)))

        threads = [
            self.background(partial(send, load.submit)),
            self.background(partial(send, load.deliver)),
        ]
        try:
            yield
        finally:
            stop.set()
            self.pending_threads.extend(threads)

    def background(self, target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    # --- 1. workers SIGKILLed at random moments -----------------------------------------

    def worker_kill(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("worker SIGKILL")
        # Runs flow through a workspace limit (the rest wait deferred), so each run is
        # short-lived next to the kills and admission is exercised on the way.
        load = self.load("worker-kill", max_active_runs=8)
        feeder = self.background(
            lambda: (
                load.submit_many(self.profile.kill_runs, concurrency=2),
                load.deliver_many(self.profile.kill_deliveries, concurrency=2),
            )
        )
        low, high = (1.5, 3.0) if self.profile.name == "light" else (3.0, 6.0)

        def work_open() -> bool:
            return feeder.is_alive() or invariants.work_open(db(lambda: invariants.progress(load)))

        while work_open():
            time.sleep(self.rng.uniform(low, high))
            if not work_open():  # the last run ended during the pause
                break
            name = self.rng.choice(["worker1", "worker2"])
            self.mark_fault(load)
            self.stack.children[name].kill()
            result.faults += 1
            self.stack.restart_worker(name)
            if time.monotonic() - started > self.profile.drain_bound:
                break
        return self.finish(result, load, started, exits)

    # --- 2. Redis restarted without persistence, backlog on every queue ----------------

    def redis_restart(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("Redis restart")
        load = self.load("redis-restart")
        assert self.stack.redis is not None
        per_round = max(1, self.profile.redis_runs // self.profile.redis_restarts)
        for _ in range(self.profile.redis_restarts):
            # A backlog on every queue: steps (agent, verify), deliveries (webhooks), and
            # the events the relay hands to consumers.
            load.submit_many(per_round, concurrency=4)
            load.deliver_many(max(2, per_round // 3), concurrency=4)
            time.sleep(1.5)
            self.mark_fault(load)
            self.stack.redis.kill()
            result.faults += 1
            with self.arrivals(load):
                time.sleep(3)
            self.stack.redis.start()
            self.recovery_marks[-1] = (self.recovery_marks[-1][0], time.time())
            time.sleep(4)
            self.stack.supervise()
        return self.finish(result, load, started, exits)

    # --- 3. PostgreSQL restarted mid-load ---------------------------------------------

    def postgres_restart(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("PostgreSQL restart")
        load = self.load("pg-restart")
        assert self.stack.postgres is not None
        per_round = max(1, self.profile.pg_runs // self.profile.pg_restarts)
        for n in range(self.profile.pg_restarts):
            load.submit_many(per_round, concurrency=4)
            load.deliver_many(max(2, per_round // 3), concurrency=4)
            time.sleep(3)
            self.mark_fault(load)
            self.stack.postgres.stop("immediate" if n % 2 else "fast")
            result.faults += 1
            with self.arrivals(load):
                time.sleep(2)
            self.stack.postgres.start()
            self.recovery_marks[-1] = (self.recovery_marks[-1][0], time.time())
            time.sleep(4)
            self.stack.supervise()
        return self.finish(result, load, started, exits)

    # --- 4. a burst of submissions as fast as the API takes them -----------------------

    def burst(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("submission burst")
        # A workspace limit far below the burst: the rest must be deferred, not dropped.
        load = self.load("burst", max_active_runs=self.profile.burst_run)
        sent = time.monotonic()
        # The first runs do the whole job; the rest carry a spent budget (no wall clock,
        # no model turns), so each is admitted (at once or after deferral) and ends at
        # its first step, timed out with its reason: the burst exercises intake and
        # admission, not the sandbox.
        load.submit_many(self.profile.burst_run, concurrency=4)
        load.submit_many(
            self.profile.burst - self.profile.burst_run,
            concurrency=8,
            budget={"wall_clock_seconds": 0, "model_turns": 0},
        )
        elapsed = time.monotonic() - sent
        statuses: dict[str, int] = {}
        for sub in load.submissions:
            key = str(sub.body.get("status") or sub.status)
            statuses[key] = statuses.get(key, 0) + 1
        result.faults = self.profile.burst
        result.notes.append(
            f"{self.profile.burst} submissions in {elapsed:.1f}s "
            f"({self.profile.burst / max(elapsed, 0.001):.0f}/s): {statuses}"
        )
        result.notes.append(accept_rate(load.submissions, sent))
        refused = [s for s in load.submissions if not s.accepted]
        if refused:
            result.violations.append(
                f"refused: {len(refused)} submissions not accepted, e.g. {refused[0].status}"
            )
        # Every deferred task still has to be admitted and run to its end through the
        # limit: the bound grows with the burst (a run that ends at its first step costs
        # under 0.1 CPU-seconds, PostgreSQL included: 2 cores end 10-25 a second).
        return self.finish(
            result, load, started, exits, bound=self.profile.drain_bound + self.profile.burst / 10
        )

    # --- 5. every delivery three times, concurrently -----------------------------------

    def webhook_triplicate(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("webhook x3 concurrent")
        load = self.load("triplicate")
        load.deliver_many(self.profile.triplicate, concurrency=2, copies=3)
        result.faults = 2 * self.profile.triplicate
        answered = sorted({str(s) for d in load.deliveries for s in d.statuses})
        result.notes.append(f"answers {answered}")
        return self.finish(result, load, started, exits)

    # --- 6. a poison delivery among healthy ones ---------------------------------------

    def poison(self) -> Result:
        from jobs.models import DeadLetter
        from webhooks.models import WebhookReceipt

        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("poison message")
        load = self.load("poison")
        poison_ids = []
        for _ in range(2):
            # Signed and well-formed JSON, but "issue" is not an object: processing
            # raises every time it is tried.
            payload = json.loads(load.delivery_body(10_000 + len(poison_ids)))
            payload["issue"] = "not an object"
            body = json.dumps(payload, separators=(",", ":")).encode()
            delivery_id = f"poison-{len(poison_ids)}-{load.scope.slug}"
            status = load.post_webhook(
                body, github_headers(body, "issues", delivery_id, WEBHOOK_SECRET)
            )
            result.notes.append(f"poison answered {status}")
            poison_ids.append(delivery_id)
            result.faults += 1
        load.submit_many(self.profile.poison_healthy, concurrency=2)
        load.deliver_many(self.profile.poison_healthy, concurrency=2)
        finished = self.finish(result, load, started, exits)

        def poison_state() -> list[str]:
            problems = []
            for delivery_id in poison_ids:
                receipt = WebhookReceipt.objects.filter(delivery_id=delivery_id).first()
                if receipt is None:
                    problems.append(f"poison {delivery_id}: no receipt")
                    continue
                letters = (
                    DeadLetter.objects.filter(args__contains=[receipt.pk]).count()
                    + DeadLetter.objects.filter(kwargs__contains={"receipt_id": receipt.pk}).count()
                )
                if receipt.status != "failed" or not letters:
                    problems.append(
                        f"poison {delivery_id}: receipt {receipt.status} after "
                        f"{receipt.attempts} attempts, {letters} dead letters"
                    )
            return problems

        deadline = time.monotonic() + 60
        problems = db(poison_state)
        while problems and time.monotonic() < deadline:
            time.sleep(1)
            problems = db(poison_state)
        finished.violations.extend(problems)
        finished.seconds = time.monotonic() - started
        return finished

    # --- 7. beat killed and restarted; two beats at once --------------------------------

    def beat(self) -> Result:
        started, exits = time.monotonic(), len(self.stack.unexpected_exits())
        result = Result("beat kill + two beats")
        # From here on the schedules run at their deployed intervals: the two beats are
        # checked, and the idle minute inside their window measured, as deployed.
        self.stack.manage("beat_schedules", "--reset")
        load = self.load("beat")
        beat = self.stack.children["beat"]
        load.submit_many(self.profile.beat_runs // 2, concurrency=2)
        # While no beat runs, a worker is killed: only the reaper can recover its runs.
        time.sleep(2)
        beat.kill()
        result.faults += 1
        self.mark_fault(load)
        self.stack.children["worker1"].kill()
        result.faults += 1
        time.sleep(3)
        self.stack.restart_worker("worker1")
        second = Child(
            "beat2",
            self.stack.beat_argv("beat2"),
            env=self.stack.env,
            cwd=beat.cwd,
            log_dir=self.stack.log_dir,
            pid_file=self.stack.pid_file,
        )
        beats = [beat, second]
        before = [beat_starts(b) for b in beats]
        beat.start()
        self.stack.extra_beats.append(second)
        second.start()
        result.faults += 1
        # The overlap counts from the moment both beats are up (each has logged its
        # start), not from when they were launched: a loaded machine takes seconds to
        # import Celery and Django.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
            beat_starts(b) <= n for b, n in zip(beats, before, strict=True)
        ):
            self.stack.supervise()
            time.sleep(0.2)
        overlap_started = time.time()
        load.submit_many(self.profile.beat_runs - self.profile.beat_runs // 2, concurrency=2)
        finished = self.finish(result, load, started, exits)

        def verdict() -> None:
            # Both beats run together for the whole window (several intervals of every
            # short schedule) before the verdict, however fast the work drained.
            while time.time() - overlap_started < self.profile.beat_overlap:
                self.stack.supervise()
                time.sleep(min(1.0, self.profile.beat_overlap - (time.time() - overlap_started)))
            overlap = time.time() - overlap_started
            restarted = [
                b.name for b, n in zip(beats, before, strict=True) if beat_starts(b) != n + 1
            ]
            if restarted or not all(b.alive() for b in beats):
                finished.violations.append(
                    f"two beats did not run together for the whole {overlap:.0f}s: "
                    f"restarted {restarted}, alive {[b.name for b in beats if b.alive()]}"
                )
            per_beat = {
                b.name: sum(
                    len(t) for t in beat_sends([b.log_path], since=overlap_started).values()
                )
                for b in beats
            }
            sends = beat_sends([b.log_path for b in beats], since=overlap_started)
            counts = {name: len(times) for name, times in sends.items()}
            finished.notes.append(
                f"two beats up together for {overlap:.0f}s; sends per beat {per_beat}; "
                f"per schedule {counts}"
            )
            finished.violations.extend(double_fires(sends))
            second.stop()
            self.stack.extra_beats.remove(second)
            finished.seconds = time.monotonic() - started

        # The window stays open while the scenarios that may share it run (see settle).
        self.open_windows.append(verdict)
        return finished

    # --- 8. idle CPU --------------------------------------------------------------------

    def idle(self) -> Result:
        started = time.monotonic()
        result = Result("idle CPU")
        # A second beat still up from the two-beat window is measured too: whichever of
        # them leads does the sending.
        children = [self.stack.children[name] for name in ("worker1", "worker2", "beat")]
        children += self.stack.extra_beats
        before = {child.name: child.cpu_seconds() for child in children}
        time.sleep(self.profile.idle_seconds)
        window = self.profile.idle_seconds
        usage = {
            child.name: (child.cpu_seconds() - before[child.name]) / window * 100
            for child in children
        }
        result.notes.append(
            f"{window}s idle, % of a core: "
            + ", ".join(f"{name} {value:.2f}" for name, value in usage.items())
        )
        over = {name: value for name, value in usage.items() if value >= 1.0}
        if over:
            result.violations.append(f"idle CPU over 1% of a core: {over}")
        result.seconds = time.monotonic() - started
        return result

    # --- 9. security inputs --------------------------------------------------------------

    def security(self) -> Result:
        from webhooks.models import WebhookReceipt

        started = time.monotonic()
        result = Result("security inputs")
        load = self.load("security")
        outsider = self.load("security-outsider")
        receipts_before = db(lambda: WebhookReceipt.objects.count())
        # The task whose objects the outsider probes; it runs while the forgeries arrive.
        load.submit()
        answers: dict[int | None, int] = {}
        valid_body = load.delivery_body(1)
        valid_sig = github_headers(valid_body, "issues", "x", WEBHOOK_SECRET)["X-Hub-Signature-256"]

        def forge(n: int) -> int | None:
            body = load.delivery_body(100 + n)
            headers = github_headers(body, "issues", f"forged-{n}", WEBHOOK_SECRET)
            kind = n % 5
            if kind == 0:  # wrong secret
                headers = github_headers(body, "issues", f"forged-{n}", "not-the-secret")
            elif kind == 1:  # truncated
                headers["X-Hub-Signature-256"] = headers["X-Hub-Signature-256"][:-8]
            elif kind == 2:  # replayed from another body
                headers["X-Hub-Signature-256"] = valid_sig
            elif kind == 3:  # missing
                del headers["X-Hub-Signature-256"]
            else:  # signed, then the body tampered with
                body = body.replace(b"add() subtracts", b"rm -rf / please")
            return load.post_webhook(body, headers)

        # From four connections, as a flood would come.
        with ThreadPoolExecutor(4) as pool:
            for status in pool.map(forge, range(self.profile.forged)):
                answers[status] = answers.get(status, 0) + 1
        result.faults = self.profile.forged
        result.notes.append(f"forged answers {answers}")
        if set(answers) != {401}:
            result.violations.append(f"forged webhooks not all 401: {answers}")
        stored = db(lambda: WebhookReceipt.objects.count()) - receipts_before
        if stored:
            result.violations.append(f"forged webhooks stored {stored} receipts")
        # An outsider's token against every object of another workspace.
        invariants.wait_drained(load, self.profile.drain_bound, self.stack.supervise)
        probes = outsider_probes(load)
        result.faults += len(probes)
        leaks = outsider_leaks(outsider, probes)
        result.notes.append(f"{len(probes)} outsider probes")
        result.violations.extend(leaks)
        if self.profile.fuzz_examples:
            result.notes.append(fuzz(self.stack, load, self.profile.fuzz_examples, result))
        result.runs = 1
        result.seconds = time.monotonic() - started
        return result


SCENARIOS: dict[str, Callable[[Harness], Result]] = {
    "worker-kill": Harness.worker_kill,
    "redis-restart": Harness.redis_restart,
    "postgres-restart": Harness.postgres_restart,
    "burst": Harness.burst,
    "webhook-triplicate": Harness.webhook_triplicate,
    "poison": Harness.poison,
    "beat": Harness.beat,
    "idle": Harness.idle,
    "security": Harness.security,
}
# Inside `make test`: the faults that have found the most (a killed worker, a restarted
# database, a redelivery storm, forged signatures) in about a minute. The Redis restart
# adds most of a minute more, so it runs in `make chaos`; inside `make test` a real worker
# rides out a restart of its Redis in test_work_items.py, and the channel teardown that
# used to make workers exit is tested in test_broker_redis_detached_close.py.
# Scenarios that may run while an earlier one's window is still open: idle needs no work
# of its own, so its minute without work passes inside the two beats' minute.
SHARES_WINDOW = {"idle"}
LIGHT_SCENARIOS = ["worker-kill", "postgres-restart", "webhook-triplicate", "security"]
