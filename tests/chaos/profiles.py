"""How large each scenario is (``light`` inside ``make test``, ``full`` for ``make chaos``),
and what a scenario reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.chaos.invariants import Findings


@dataclass(frozen=True)
class Profile:
    name: str
    kill_runs: int
    kill_deliveries: int
    redis_runs: int
    redis_restarts: int
    pg_runs: int
    pg_restarts: int
    burst: int
    burst_run: int
    triplicate: int
    poison_healthy: int
    beat_runs: int
    idle_seconds: int
    beat_overlap: float
    forged: int
    fuzz_examples: int
    drain_bound: float


LIGHT = Profile(
    name="light",
    kill_runs=6,
    kill_deliveries=2,
    redis_runs=4,
    redis_restarts=1,
    pg_runs=6,
    pg_restarts=1,
    burst=60,
    burst_run=6,
    triplicate=4,
    poison_healthy=4,
    beat_runs=4,
    idle_seconds=10,
    beat_overlap=25,
    forged=40,
    fuzz_examples=0,
    drain_bound=150,
)
FULL = Profile(
    name="full",
    kill_runs=200,
    kill_deliveries=20,
    redis_runs=40,
    redis_restarts=4,
    pg_runs=30,
    pg_restarts=3,
    burst=10_000,
    burst_run=20,
    triplicate=30,
    poison_healthy=10,
    beat_runs=10,
    idle_seconds=60,
    beat_overlap=60,
    forged=1000,
    fuzz_examples=5,
    drain_bound=420,
)


@dataclass
class Result:
    scenario: str
    runs: int = 0
    faults: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    recovery: float = 0.0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def absorb(self, found: Findings) -> None:
        self.runs = found.runs
        self.lost += found.lost
        self.duplicated += found.duplicated
        self.stuck += found.stuck
        self.violations.extend(found.violations)
        if found.failed_runs:
            self.notes.append(f"{found.failed_runs} runs failed (with a reason)")
            self.notes.extend(f"  {failure}" for failure in found.failures[:5])
        if found.dead_letters:
            self.notes.append(f"{found.dead_letters} dead letters")
            self.notes.extend(f"  {letter}" for letter in found.letters[:5])
        if found.model_requests:
            self.notes.append(
                f"{found.model_requests} model requests at the endpoint, "
                f"{found.model_reasked} of a turn not yet checkpointed asked again"
            )
