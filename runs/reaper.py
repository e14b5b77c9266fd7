"""The zombie reaper: runs whose lease expired lost their worker; recover or fail them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.locks import sweep_lock
from runs import dispatch
from runs.ending import run_end_unleased
from runs.logs import log
from runs.models import ModelTurn, Run, RunEvent
from runs.services import run_recover_stalled
from runs.state import ACTIVE
from runs.timeline import PendingEvent, events_record


@dataclass
class ReapReport:
    recovered: int = 0
    failed: int = 0
    redispatched: int = 0
    skipped: bool = False


def crashes_here(run: Run) -> tuple[int, int]:
    """How many recoveries in a row this one makes at the run's current point, and the
    model turns answered so far: the point is the step and those turns (docs/design.md,
    Decisions: "Recoveries count where the step crashed").

    An expired lease does not say why: a worker that crashed (a poison step brings down
    every worker that takes it) or an infrastructure fault (a heartbeat that could not
    reach the database, a lost worker). A poison step crashes where it crashed before;
    a fault meets runs wherever they are, and a run that moved on since its last
    recovery (a step committed, a turn answered) starts over at one.
    """
    last = (
        RunEvent.objects.filter(run=run, type="agent.run.recovered")
        .order_by("-sequence_no")
        .values_list("data", flat=True)
        .first()
    )
    turns = ModelTurn.objects.filter(run=run).count()
    if last is None or last.get("step_no") != run.step_no or last.get("model_turns") != turns:
        return 1, turns
    return int(last.get("crashes_here", 1)) + 1, turns


def zombies_reap(*, limit: int = 100) -> ReapReport:
    """Recover runs with expired leases; fail those that crashed at the same point more
    than ``RUN_MAX_RECOVERIES`` times in a row (``crashes_here``).

    A worker's heartbeat renews its lease every third of the lease length, so an expired
    lease means the worker is gone or stalled. Clearing the lease here fences it out:
    its later writes compare (owner, attempt) and change nothing. ``recoveries`` counts
    every recovery of the run; only the ones in a row at one point end it.
    """
    report = ReapReport()
    now = timezone.now()
    with sweep_lock("reaper") as held:
        if not held:
            report.skipped = True
            return report
        expired = list(
            Run.objects.filter(status__in=ACTIVE, lease_until__lt=now)
            .select_related("task")
            .order_by("lease_until")[:limit]
        )
        for run in expired:
            assert run.lease_until is not None  # the filter above (lease_until__lt) excludes NULL
            missed = PendingEvent(
                "agent.run.heartbeat.missed",
                {
                    "lease_owner": run.lease_owner,
                    "lease_until": run.lease_until.isoformat(),
                    "attempt": run.attempt,
                    "recoveries": run.recoveries,
                },
            )
            here, turns = crashes_here(run)
            if here > settings.RUN_MAX_RECOVERIES:
                Run.objects.filter(pk=run.pk, attempt=run.attempt).update(
                    lease_owner="", lease_until=None
                )

                def fail_unleased(
                    run: Run = run, missed: PendingEvent = missed, here: int = here
                ) -> None:
                    run_end_unleased(
                        run_id=run.id,
                        target=Run.Status.FAILED,
                        reason="recoveries_exhausted",
                        detail=f"worker lost {here} times in a row at step {run.step_no}",
                        events=[missed],
                    )

                transaction.on_commit(fail_unleased)
                report.failed += 1
                continue
            # Compare-and-set on the fencing token: a worker that renewed meanwhile wins.
            cleared = Run.objects.filter(
                pk=run.pk, attempt=run.attempt, lease_until__lt=now
            ).update(lease_owner="", lease_until=None, recoveries=F("recoveries") + 1)
            if not cleared:
                continue
            # Registered first, so the run's wake-up is the first thing sent on commit.
            dispatch.run_wake_on_commit(run_id=run.id, step_no=run.step_no, status=run.status)
            events_record(
                task=run.task,
                run=run,
                events=[
                    missed,
                    PendingEvent(
                        "agent.run.recovered",
                        {
                            "step_no": run.step_no,
                            "recoveries": run.recoveries + 1,
                            "model_turns": turns,
                            "crashes_here": here,
                        },
                    ),
                ],
            )
            report.recovered += 1
    report.redispatched = run_recover_stalled(
        stall_after=timedelta(seconds=settings.RUN_STALL_SECONDS)
    )
    if report.recovered or report.failed or report.redispatched:
        log.warning(
            "reaper.swept",
            recovered=report.recovered,
            failed=report.failed,
            redispatched=report.redispatched,
        )
    return report


def oldest_lease_age_seconds() -> float:
    """Age of the oldest lease held by an active run (a gauge for liveness)."""
    oldest = (
        Run.objects.filter(status__in=ACTIVE, lease_until__isnull=False)
        .order_by("heartbeat_at")
        .values_list("heartbeat_at", flat=True)
        .first()
    )
    return (timezone.now() - oldest).total_seconds() if oldest else 0.0
