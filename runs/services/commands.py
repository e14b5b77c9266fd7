"""Commands on runs: cancellation and approval decisions. They record a request and wake
the orchestrator, which decides; they never set a run's status."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from runs import dispatch
from runs.identities import requested_by_user
from runs.models import (
    Approval,
    Membership,
    Run,
    Task,
    Workspace,
)
from runs.services.errors import ApprovalNotAllowed, CommandRefused
from runs.state import TERMINAL
from runs.timeline import (
    event_record,
)


def run_cancel_request(*, run: Run, by: str, reason: str = "") -> bool:
    """Ask for cancellation; the orchestrator stops the run at its next check.

    Returns False if the run already ended (nothing to cancel).
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("task").get(pk=run.pk)
        if locked.status in TERMINAL:
            return False
        # A run that no worker holds (queued, awaiting approval) needs a wake-up to end;
        # sent first on commit, before the event's wake-ups.
        dispatch.run_wake_on_commit(run_id=locked.id, step_no=locked.step_no, status=locked.status)
        if locked.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(
                cancel_requested_at=timezone.now(),
                cancel_requested_by=by,
                cancel_reason=reason[:500],
            )
            event_record(
                task=locked.task,
                run=locked,
                type="agent.run.cancel.requested",
                data={"by": by, "reason": reason},
                actor=by,
            )
    return True


def approval_permission_check(*, run: Run, user: Any) -> None:
    """Raise ApprovalNotAllowed unless the workspace's policy lets ``user`` decide.

    Who may decide is the workspace's setting (``approval_by``): its approvers and admins
    (the default), or any member; superusers always may. Whoever asked for a high-risk
    task may not approve it themselves unless the workspace allows it.
    """
    task = run.task
    workspace = task.workspace
    role = (
        Membership.objects.filter(workspace=workspace, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if not user.is_superuser:
        if role is None:
            raise ApprovalNotAllowed("approval_not_allowed", "not a member of the workspace")
        allowed = (
            {Membership.Role.APPROVER, Membership.Role.ADMIN}
            if workspace.approval_by == Workspace.ApprovalBy.APPROVERS
            else set(Membership.Role)
        )
        if role not in allowed:
            raise ApprovalNotAllowed(
                "approval_not_allowed",
                f"the workspace lets {workspace.get_approval_by_display()} decide; "
                f"your role is {role}",
            )
    if (
        task.risk_level == Task.Risk.HIGH
        and requested_by_user(task=task, user=user)
        and not workspace.approval_self_high_risk
    ):
        raise ApprovalNotAllowed(
            "self_approval_not_allowed",
            "a high-risk task needs someone other than its requester to approve it",
        )


def _approval_fresh_check(approval: Approval, *, patch_sha256: str | None, seen_at: Any) -> None:
    """Refuse (approval_stale) a decision about another patch than the pending one.

    ``patch_sha256`` is the diff's SHA-256 the decider names, in full (API, console) or
    as a prefix of at least 7 hex digits (a PR comment); ``seen_at`` is when the decider
    wrote a decision that names no patch: one written before this patch was put up for
    approval cannot be about it.
    """
    if patch_sha256 is not None and (
        len(patch_sha256) < 7 or not approval.patch_sha256.startswith(patch_sha256.lower())
    ):
        raise CommandRefused(
            "approval_stale",
            "the patch pending approval is not the one that was shown; reload and look again",
        )
    if seen_at is not None and approval.requested_at > seen_at:
        raise CommandRefused(
            "approval_stale",
            "the patch pending approval was put up after this decision was written",
        )


def _approval_decide(
    *,
    run: Run,
    by: str,
    status: str,
    comment: str,
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("task__workspace").get(pk=run.pk)
        if locked.status != Run.Status.AWAITING_APPROVAL:
            raise CommandRefused(
                "not_awaiting_approval", f"run is {locked.status}, not awaiting approval"
            )
        approval = (
            Approval.objects.select_for_update()
            .filter(run=locked, status=Approval.Status.PENDING)
            .first()
        )
        if approval is None:
            raise CommandRefused("no_pending_approval", "run has no pending approval")
        # Rejecting stops a change: the requester may always withdraw their own.
        withdrawal = (
            status == Approval.Status.REJECTED
            and user is not None
            and requested_by_user(task=locked.task, user=user)
        )
        if user is None:
            # Every path (API, console, PR comment) decides as a platform user, so one
            # policy holds for all of them.
            raise ApprovalNotAllowed("approval_not_allowed", "a decision needs a platform user")
        if not withdrawal:
            approval_permission_check(run=locked, user=user)
        _approval_fresh_check(approval, patch_sha256=patch_sha256, seen_at=seen_at)
        approval.status = status
        approval.decided_at = timezone.now()
        approval.decided_by = by
        approval.comment = comment
        approval.save(update_fields=["status", "decided_at", "decided_by", "comment"])
        dispatch.run_wake_on_commit(run_id=locked.id, step_no=locked.step_no, status=locked.status)
        event_record(
            task=locked.task,
            run=locked,
            type=f"agent.approval.{status}",
            data={"by": by, "comment": comment, "patch_sha256": approval.patch_sha256},
            actor=by,
        )
    return approval


def run_approve(
    *,
    run: Run,
    by: str,
    comment: str = "",
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    """Approve the pending patch; the run goes on to open its pull request.

    With ``user`` the workspace's approval policy applies: the API, the console and a
    PR comment (through the commenter's linked provider identity) all pass it. With
    ``patch_sha256`` (or a prefix of it), only that exact diff is approved.
    """
    return _approval_decide(
        run=run,
        by=by,
        status=Approval.Status.APPROVED,
        comment=comment,
        user=user,
        patch_sha256=patch_sha256,
        seen_at=seen_at,
    )


def run_reject(
    *,
    run: Run,
    by: str,
    comment: str = "",
    user: Any,
    patch_sha256: str | None = None,
    seen_at: Any = None,
) -> Approval:
    """Reject the pending patch; the run ends failed (approval_rejected)."""
    return _approval_decide(
        run=run,
        by=by,
        status=Approval.Status.REJECTED,
        comment=comment,
        user=user,
        patch_sha256=patch_sha256,
        seen_at=seen_at,
    )


def approvals_expire(*, now: Any = None) -> int:
    """Expire pending approvals past their deadline and wake their runs.

    Locks the run first and the approval second, the order every approval command uses,
    so expiry racing an approve cannot deadlock. An approval whose run is no longer
    waiting for it is voided, not expired: no ``approval.expired`` after a run ended.
    """
    now = now or timezone.now()
    expired = 0
    for approval_id, run_id in Approval.objects.filter(
        status=Approval.Status.PENDING, expires_at__lt=now
    ).values_list("pk", "run_id")[:200]:
        with transaction.atomic():
            run = Run.objects.select_for_update().select_related("task").get(pk=run_id)
            approval = (
                Approval.objects.select_for_update()
                .filter(pk=approval_id, status=Approval.Status.PENDING)
                .first()
            )
            if approval is None:
                continue
            if run.status != Run.Status.AWAITING_APPROVAL:
                approvals_void(run_id=run.pk, now=now)
                continue
            approval.status = Approval.Status.EXPIRED
            approval.decided_at = now
            approval.save(update_fields=["status", "decided_at"])
            dispatch.run_wake_on_commit(run_id=run.id, step_no=run.step_no, status=run.status)
            event_record(
                task=run.task,
                run=run,
                type="agent.approval.expired",
                data={"expired_at": approval.expires_at.isoformat()},
            )
            expired += 1
    return expired


def approvals_void(*, run_id: Any, now: Any = None) -> int:
    """Void the run's pending approvals (the run ended); call under the run's row lock."""
    return _approvals_pending(run_id).update(**_approvals_voided(now))


def _approvals_pending(run_id: Any) -> QuerySet[Approval]:
    return Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING)


def _approvals_voided(now: Any) -> dict[str, Any]:
    return {
        "status": Approval.Status.VOID,
        "decided_at": now or timezone.now(),
        "reason": "run ended",
    }
