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
from runs.models import Run
from runs.services import run_recover_stalled
from runs.state import ACTIVE
from runs.timeline import PendingEvent, events_record


@dataclass
class ReapReport:
    recovered: int = 0
    failed: int = 0
    redispatched: int = 0
    skipped: bool = False


def zombies_reap(*, limit: int = 100) -> ReapReport:
    """Recover runs with expired leases; fail those whose recoveries are spent.

    A worker's heartbeat renews its lease every third of the lease length, so an expired
    lease means the worker is gone or stalled. Clearing the lease here fences it out:
    its later writes compare (owner, attempt) and change nothing.
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
            if run.recoveries >= settings.RUN_MAX_RECOVERIES:
                Run.objects.filter(pk=run.pk, attempt=run.attempt).update(
                    lease_owner="", lease_until=None
                )

                def fail_unleased(run: Run = run, missed: PendingEvent = missed) -> None:
                    run_end_unleased(
                        run_id=run.id,
                        target=Run.Status.FAILED,
                        reason="recoveries_exhausted",
                        detail=f"worker lost {run.recoveries + 1} times",
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
                        {"step_no": run.step_no, "recoveries": run.recoveries + 1},
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
