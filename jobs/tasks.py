"""Celery entry points for delivery and the safety-net sweeps run by beat."""

from __future__ import annotations

from celery import shared_task

from jobs.durable import DurableTask


@shared_task(name="jobs.outbox_relay", base=DurableTask, ignore_result=True)
def outbox_relay() -> int:
    from jobs.relay import outbox_relay_batch

    published = total = outbox_relay_batch()
    while published:
        published = outbox_relay_batch()
        total += published
    return total


@shared_task(name="jobs.zombies_reap", base=DurableTask, ignore_result=True)
def zombies_reap() -> dict[str, int]:
    from jobs.reaper import zombies_reap as reap

    report = reap()
    return {"recovered": report.recovered, "failed": report.failed,
            "redispatched": report.redispatched}


@shared_task(name="jobs.approvals_expire", base=DurableTask, ignore_result=True)
def approvals_expire() -> int:
    from runs.services import approvals_expire as expire

    return expire()


@shared_task(name="jobs.tasks_readmit", base=DurableTask, ignore_result=True)
def tasks_readmit() -> int:
    from runs.services import tasks_readmit as readmit

    return readmit()


@shared_task(name="jobs.sandboxes_sweep", base=DurableTask, ignore_result=True)
def sandboxes_sweep() -> int:
    from runs.agent.sandbox import sandbox_orphans_sweep
    from runs.models import Run
    from runs.state import ACTIVE

    active = {str(pk) for pk in Run.objects.filter(status__in=ACTIVE).values_list("pk", flat=True)}
    return len(sandbox_orphans_sweep(active_run_ids=active))
