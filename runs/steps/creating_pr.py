"""creating_pr: commit, push and open or update the task's pull request."""

from __future__ import annotations

from runs.agent.artifacts import redact
from runs.agent.platform_git import patch_commit
from runs.agent.sandbox import CommandCancelled, SandboxError
from runs.agent.workspace import platform_repository
from runs.gitproviders import git_provider_for
from runs.gitproviders.base import GitProvider, GitProviderError, PullRequestInfo
from runs.models import Approval, Patch, PullRequest
from runs.protocol import (
    Outcome,
    RunCancelled,
    StepContext,
    StepFailed,
    TransientStepError,
)
from runs.steps.common import S


def _patch_match(ctx: StepContext, patch: Patch, pushed_sha256: str, branch: str) -> None:
    """Refuse to push anything but the verified patch and, where one was needed, the
    approved one."""
    expected = {patch.diff_sha256}
    approval = (
        Approval.objects.filter(run=ctx.run, status=Approval.Status.APPROVED)
        .order_by("-requested_at")
        .first()
    )
    if approval is not None:
        expected.add(approval.patch_sha256)
    if expected == {pushed_sha256}:
        return
    detail = (
        f"the commit's diff (sha256 {pushed_sha256[:12]}) differs from the verified "
        f"patch ({patch.diff_sha256[:12]})"
        + (f" or its approval ({approval.patch_sha256[:12]})" if approval else "")
    )
    ctx.emit(
        "agent.pr.creation.failed",
        {"branch": branch, "error": f"patch_mismatch: {detail}", "reason": "patch_mismatch"},
    )
    raise StepFailed("patch_mismatch", detail)


def commit_message(*, summary: str, instruction: str, submitted_by: str = "") -> tuple[str, str]:
    """The commit's subject and whole message, from the model's own summary of its
    change (the finish tool's ``summary``); the instruction only when it gave none.

    The summary is the model's text: secrets are redacted from it like from any other
    output, and it is cut to a subject line of 72 characters.
    """
    summary = redact(summary.strip())
    source = summary or instruction.strip()
    lines = source.splitlines() or [""]
    first = lines[0].strip()
    subject = f"agent: {first[:65]}{'…' if len(first) > 65 else ''}"
    body = "\n".join(lines[1:]).strip() if summary else ""
    notes = [body] if body else []
    if summary:
        notes.append(f"Task: {instruction.strip()[:1000]}")
    if submitted_by:
        notes.append(f"Submitted by the platform ({submitted_by}): the model did not finish.")
    return subject, "\n\n".join([subject, *notes])


def step_creating_pr(ctx: StepContext) -> Outcome:
    """Commit, push and open (or update) the task's single pull request.

    The commit is built in the platform's own repository from the checkpointed diff,
    never from the working copy's ``.git``, and its diff is computed again from the
    commit: if that differs by one byte from the patch that was verified, judged and
    (where required) approved, nothing is pushed and the run fails (``patch_mismatch``).

    Each part of the saga repeats safely: the commit is remade from the checkpointed
    patch, the push is forced onto the task's own branch, the provider looks the PR up by
    branch before opening one, and the row is an upsert on (task, provider). A dry run
    stops before anything leaves the sandbox.
    """
    patch = Patch.objects.get(pk=ctx.checkpoint["patch_id"])
    if ctx.task.execution_mode == "dry_run":
        ctx.emit("agent.pr.skipped", {"reason": "dry_run", "patch_id": patch.id})
        return Outcome(to=S.COMPLETED)
    repository = ctx.repository
    provider = git_provider_for(repository.provider)
    branch = ctx.run.branch
    base_branch = ctx.task.target_branch or repository.default_branch
    title, message = commit_message(
        summary=str(ctx.checkpoint.get("summary") or ""),
        instruction=ctx.task.instruction,
        submitted_by=patch.submitted_by,
    )
    body = (
        f"{ctx.task.instruction}\n\n---\nRun {ctx.run.run_no} ({ctx.run.id}), "
        f"attempt {patch.attempt_no}, patch {patch.diff_sha256[:12]}."
    )
    if ctx.run.feedback:
        body += f"\n\nAddresses feedback:\n{ctx.run.feedback[:2000]}"
    ctx.emit(
        "agent.pr.creation.requested",
        {"branch": branch, "base": base_branch, "provider": provider.name},
    )
    ctx.check_cancelled()
    head_sha, info = _pull_request_publish(
        ctx,
        patch=patch,
        provider=provider,
        branch=branch,
        base_branch=base_branch,
        title=title,
        message=message,
        body=body,
    )
    _pull_request_record(
        ctx,
        provider=provider,
        info=info,
        branch=branch,
        base_branch=base_branch,
        head_sha=head_sha,
        title=title,
    )
    return Outcome(to=S.COMPLETED)


def _pull_request_publish(
    ctx: StepContext,
    *,
    patch: Patch,
    provider: GitProvider,
    branch: str,
    base_branch: str,
    title: str,
    message: str,
    body: str,
) -> tuple[str, PullRequestInfo]:
    """The verified patch committed in the platform's repository, pushed to the task's
    branch, and its pull request opened or found; the commit and the request."""
    try:
        git_dir = platform_repository(ctx.run, ctx.should_stop)
        head_sha, pushed = patch_commit(
            git_dir=git_dir,
            base=ctx.run.base_commit,
            diff=ctx.checkpoint.get("diff") or "",
            message=message,
        )
        _patch_match(ctx, patch, pushed.sha256, branch)
        provider.branch_push(
            repository=ctx.repository,
            git_dir=git_dir,
            commit=head_sha,
            branch=branch,
            should_stop=ctx.should_stop,
        )
        info = provider.pull_request_ensure(
            repository=ctx.repository,
            branch=branch,
            base_branch=base_branch,
            title=title,
            body=body,
            head_sha=head_sha,
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except GitProviderError as exc:
        if exc.retryable:
            raise TransientStepError(str(exc)) from exc
        ctx.emit("agent.pr.creation.failed", {"branch": branch, "error": redact(str(exc))[:500]})
        raise StepFailed("pr_creation_failed", str(exc)) from exc
    except SandboxError as exc:
        ctx.emit("agent.pr.creation.failed", {"branch": branch, "error": redact(str(exc))[:500]})
        raise StepFailed("pr_creation_failed", str(exc)) from exc
    return head_sha, info


def _pull_request_record(
    ctx: StepContext,
    *,
    provider: GitProvider,
    info: PullRequestInfo,
    branch: str,
    base_branch: str,
    head_sha: str,
    title: str,
) -> None:
    """The task's pull request row (an upsert on task and provider), with the step's
    commit, and its ``agent.pr.created`` or ``agent.pr.updated`` event."""
    existed = PullRequest.objects.filter(task=ctx.task, provider=provider.name).exists()

    def record() -> None:
        PullRequest.objects.update_or_create(
            task=ctx.task,
            provider=provider.name,
            defaults={
                "branch": branch,
                "base_branch": base_branch,
                "number": info.number,
                "url": info.url,
                "head_sha": head_sha,
                "title": title,
                "last_run": ctx.run,
                "state": PullRequest.State.OPEN,
            },
        )

    ctx.write_on_commit(record)
    kind = "updated" if existed or not info.created else "created"
    ctx.emit(
        f"agent.pr.{kind}",
        {
            "number": info.number,
            "url": info.url,
            "branch": branch,
            "head_sha": head_sha,
            "provider": provider.name,
            "reconciled": not existed and not info.created,
        },
    )
