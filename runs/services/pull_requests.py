"""What a pull request's state, as its Git provider reports it, means for its task."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from runs.models import PullRequest, Task
from runs.services.commands import run_cancel_request
from runs.state import ACTIVE
from runs.timeline import event_record


@dataclass(frozen=True)
class PullRequestChange:
    """What recording a state change did: ``changed`` False means nothing was new."""

    changed: bool
    reason: str


_EVENT_TYPES = {
    "merged": "agent.pr.merged",
    "closed": "agent.pr.closed",
    "open": "agent.pr.updated",
}


@transaction.atomic(savepoint=False)
def pull_request_state_record(
    *, pr: PullRequest, state: str, by: str, head_sha: str = ""
) -> PullRequestChange:
    """Record a provider-side state change of ``pr`` and what it means for its task.

    A new head commit of an open PR is only noted. A PR closed or merged while a run of
    its task is active: closed asks for the run's cancellation; with no run active the
    task ends (completed when merged, cancelled when closed). Under the PR's row lock,
    so two deliveries of one change record it once.
    """
    locked = PullRequest.objects.select_for_update().select_related("task").get(pk=pr.pk)
    task = locked.task
    if state == PullRequest.State.OPEN and head_sha:
        if locked.head_sha == head_sha:
            return PullRequestChange(False, "head commit already known")
        PullRequest.objects.filter(pk=pr.pk).update(head_sha=head_sha, updated_at=timezone.now())
        return PullRequestChange(True, f"pull request #{locked.number} head is now {head_sha[:12]}")
    if locked.state == state:
        return PullRequestChange(False, f"pull request #{locked.number} already {state}")
    PullRequest.objects.filter(pk=pr.pk).update(state=state, updated_at=timezone.now())
    run = locked.last_run or task.runs.order_by("-run_no").first()
    event_record(
        task=task,
        run=run,
        type=_EVENT_TYPES[state],
        data={"number": locked.number, "url": locked.url, "state": state, "by": by},
        actor=by,
    )
    if state == PullRequest.State.OPEN:
        return PullRequestChange(True, f"pull request #{locked.number} reopened")
    active = task.runs.filter(status__in=ACTIVE).order_by("-run_no").first()
    # Feedback waiting for a follow-up no longer has a PR to go to.
    Task.objects.filter(pk=task.pk).update(pending_feedback="")
    if active is not None and state == PullRequest.State.CLOSED:
        run_cancel_request(run=active, by=by, reason="pull request closed without merge")
        return PullRequestChange(
            True,
            f"pull request #{locked.number} closed; run {active.run_no} cancellation requested",
        )
    if active is None:
        Task.objects.filter(pk=task.pk).update(
            status=Task.Status.COMPLETED if state == "merged" else Task.Status.CANCELLED,
            status_reason=f"pull request #{locked.number} {state}"[:500],
            updated_at=timezone.now(),
        )
    return PullRequestChange(True, f"pull request #{locked.number} {state}")
