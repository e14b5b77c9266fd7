"""awaiting_approval: act on the recorded decision."""

from __future__ import annotations

from runs.agent.platform_git import diff_sha256
from runs.models import Approval, Patch
from runs.protocol import Outcome, StepContext
from runs.steps.common import S


def step_awaiting_approval(ctx: StepContext) -> Outcome:
    """Act on the decision recorded by approve/reject/expire; wait while it is pending."""
    approval = Approval.objects.filter(run=ctx.run).order_by("-requested_at").first()
    if approval is None or approval.status == Approval.Status.PENDING:
        return Outcome(noop=True)
    if approval.status == Approval.Status.REJECTED:
        return Outcome(to=S.FAILED, reason="approval_rejected", detail=approval.comment)
    if approval.status == Approval.Status.EXPIRED:
        return Outcome(to=S.FAILED, reason="approval_expired")
    if approval.status == Approval.Status.APPROVED:
        # The approval covers one exact diff: the one about to be pushed (the
        # checkpoint's), under the patch it was requested for. Anything else voids it.
        patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
        pending_diff = diff_sha256(ctx.checkpoint.get("diff") or "")
        if (
            approval.patch_id != patch.id
            or approval.patch_sha256 != patch.diff_sha256
            or approval.patch_sha256 != pending_diff
        ):
            approval.status = Approval.Status.VOID
            approval_pk = approval.pk

            def void_approval() -> None:
                Approval.objects.filter(pk=approval_pk).update(status=Approval.Status.VOID)

            ctx.write_on_commit(void_approval)
            return Outcome(
                to=S.FAILED, reason="approval_void", detail="patch changed after approval"
            )
        return Outcome(to=S.CREATING_PR)
    return Outcome(noop=True)
