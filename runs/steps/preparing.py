"""queued and preparing: announce the run, clone the repository."""

from __future__ import annotations

from jobs.ids import short_id
from runs.agent.sandbox import CommandCancelled, SandboxError
from runs.agent.workspace import workspace_clone
from runs.engine import Outcome, RunCancelled, StepContext, StepFailed
from runs.models import PullRequest, Task
from runs.steps.common import S, _setup


def step_queued(ctx: StepContext) -> Outcome:
    ctx.emit("agent.run.started", {"run_no": ctx.run.run_no, "attempt": ctx.lease.attempt})
    return Outcome(to=S.PREPARING)


def task_branch(task: Task) -> str:
    """The branch a task's first run pushes to (follow-ups push to its PR's branch)."""
    return f"agent/{short_id(task.id, 12)}"


def step_preparing(ctx: StepContext) -> Outcome:
    """Clone the repository; follow-ups start from the task's PR branch."""
    repository = ctx.repository
    pr = PullRequest.objects.filter(task=ctx.task).first()
    ref = ctx.task.target_branch or repository.default_branch
    branch = pr.branch if pr else task_branch(ctx.task)
    start_ref = f"origin/{branch}" if pr else f"origin/{ref}"
    ctx.check_cancelled()
    try:
        sandbox, sha = workspace_clone(
            run=ctx.run, ref=start_ref, attempt=ctx.lease.attempt, should_stop=ctx.should_stop
        )
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except SandboxError as exc:
        raise StepFailed("clone_failed", str(exc)) from exc
    ctx.checkpoint.update({"diff": "", "attempt_no": 1, "act_turns": 0, "messages": []})
    ctx.emit(
        "agent.sandbox.created",
        {"base_commit": sha, "ref": start_ref, "sandbox": sandbox.path.name},
    )
    # The repository's environment before the agent starts (network only if its policy
    # says so, and only here); later steps mount the cached result read-only.
    ctx.checkpoint.pop("setup_key", None)
    setup = _setup(ctx, sandbox, base=sha)
    if setup is not None:
        ctx.emit(
            "agent.setup.completed",
            {
                "cache_key": setup.key,
                "cached": setup.cached,
                "duration_ms": setup.duration_ms,
                "network": ctx.repository.setup_network,
            },
        )
    return Outcome(to=S.CONTEXT_LOADING, fields={"base_commit": sha, "branch": branch})
