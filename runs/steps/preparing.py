"""queued and preparing: announce the run, clone the repository."""

from __future__ import annotations

from jobs.ids import short_id
from runs.agent.environment import environment_detect, preflight_command
from runs.agent.sandbox import CommandCancelled, LocalSandbox, SandboxError
from runs.agent.workspace import workspace_clone
from runs.models import PullRequest, Task
from runs.protocol import Outcome, RunCancelled, StepContext, StepFailed
from runs.steps.common import S, _setup, environment_failed, test_command_of

PREFLIGHT_TIMEOUT_SECONDS = 60


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
    ctx.checkpoint.pop("environment", None)
    if not repository.test_command.strip():
        _environment_detect(ctx, sandbox)
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
    _preflight(ctx, sandbox)
    return Outcome(to=S.CONTEXT_LOADING, fields={"base_commit": sha, "branch": branch})


def _environment_detect(ctx: StepContext, sandbox: LocalSandbox) -> None:
    """The test command and setup the base commit's files call for, kept for the run."""
    detected = environment_detect(sandbox.path)
    if detected is None:
        raise environment_failed(
            ctx,
            "environment_error",
            "the repository's files do not say how its tests run (no pytest or Python "
            "project, package.json test script, go.mod or Cargo.toml); set its test_command",
            stage="detection",
            command="",
        )
    ctx.checkpoint["environment"] = detected.as_dict()
    ctx.emit(
        "agent.environment.detected",
        {
            "kind": detected.kind,
            "test_command": detected.test_command,
            # The repository's own setup, when it names one, still wins.
            "setup_command": ctx.repository.setup_command.strip() or detected.setup_command,
            "evidence": detected.evidence,
        },
    )


def _preflight(ctx: StepContext, sandbox: LocalSandbox) -> None:
    """Before the agent spends anything: the test command's program (and test runner
    module) is in the sandbox. A missing one is the environment's failure, not a wrong
    patch, and no attempt of the agent could fix it."""
    command = test_command_of(ctx)
    check = preflight_command(command)
    if check is None:
        return
    try:
        result = sandbox.run(check, timeout=PREFLIGHT_TIMEOUT_SECONDS, should_stop=ctx.should_stop)
    except CommandCancelled as exc:
        raise RunCancelled() from exc
    except SandboxError as exc:
        raise StepFailed("sandbox_error", str(exc)) from exc
    if result.exit_code == 127:
        raise environment_failed(
            ctx,
            "environment_error",
            f"the test command `{command}` cannot run in the sandbox",
            stage="preflight",
            command=command,
            output=result.output,
        )
