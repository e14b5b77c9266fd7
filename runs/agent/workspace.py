"""The run's working copy: a fresh directory per lease attempt, filled by the platform's
own git from its repository (the base commit plus the checkpointed diff).

Nothing here trusts the working copy: it is created by the platform, its diff is
computed in the platform repository from its file contents (``platform_git``), and a
new attempt never reuses a directory an older attempt's commands could still write.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runs.agent import platform_git
from runs.agent.platform_git import Diff
from runs.agent.sandbox import (
    LocalSandbox,
    platform_repository_path,
    run_workdirs_remove,
    sandbox_for_run,
)
from runs.gitproviders import git_provider_for
from runs.models import Run
from runs.repositories import CloneUrlRefused, clone_url_check_before_use

__all__ = [
    "Diff",
    "workspace_clone",
    "workspace_diff",
    "workspace_ensure",
    "workspace_restore",
    "workspace_scratch",
]


def platform_repository(run: Run, should_stop: Callable[[], bool] | None = None) -> Path:
    """The run's platform-owned repository on this host, fetched from the origin once
    (stopped by ``should_stop``: cancellation, a lost lease)."""
    repository = run.task.repository
    try:
        clone_url_check_before_use(repository.clone_url)
    except CloneUrlRefused as exc:
        raise platform_git.PlatformGitError(f"clone URL refused: {exc}") from exc
    provider = git_provider_for(repository.provider)
    config, secret = provider.git_credentials(repository)
    return platform_git.repository_fetch(
        url=repository.clone_url,
        dest=platform_repository_path(run.id),
        config=config,
        secret=secret,
        should_stop=should_stop,
    )


def _fresh(run: Run, attempt: int, git_dir: Path) -> LocalSandbox:
    sandbox = sandbox_for_run(run.id, attempt)
    sandbox.git_dir = git_dir
    # Older attempts' directories go: whatever still runs there writes into nothing
    # this attempt reads.
    run_workdirs_remove(run.id, keep=sandbox.path)
    sandbox.create()
    return sandbox


def workspace_clone(
    *, run: Run, ref: str, attempt: int, should_stop: Callable[[], bool] | None = None
) -> tuple[LocalSandbox, str]:
    """A fresh working copy of the run's repository at ``ref``; it and the commit sha."""
    git_dir = platform_repository(run, should_stop)
    sha = platform_git.commit_resolve(git_dir, ref)
    sandbox = _fresh(run, attempt, git_dir)
    try:
        platform_git.worktree_create(git_dir=git_dir, workdir=sandbox.path, commit=sha)
    except BaseException:
        sandbox.remove()
        raise
    return sandbox, sha


def workspace_ensure(
    *,
    run: Run,
    attempt: int,
    diff: str | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LocalSandbox:
    """This attempt's working copy: the base commit plus ``diff``, made if missing."""
    git_dir = platform_repository(run, should_stop)
    sandbox = sandbox_for_run(run.id, attempt)
    sandbox.git_dir = git_dir
    if sandbox.exists() and (sandbox.path / ".git").exists():
        return sandbox
    sandbox = _fresh(run, attempt, git_dir)
    try:
        platform_git.worktree_create(
            git_dir=git_dir, workdir=sandbox.path, commit=run.base_commit, diff=diff or ""
        )
    except BaseException:
        sandbox.remove()
        raise
    return sandbox


def workspace_scratch(*, run: Run, name: str, diff: str = "") -> LocalSandbox:
    """A fresh copy of the base commit plus ``diff`` for one command of the platform's
    (the verifier's), apart from the agent's working copy: nothing the agent's commands
    left there, ignored files included, is in it."""
    git_dir = platform_repository(run)
    sandbox = LocalSandbox(f"run-{run.id}-{name}")
    sandbox.git_dir = git_dir
    sandbox.create()
    try:
        platform_git.worktree_create(
            git_dir=git_dir, workdir=sandbox.path, commit=run.base_commit, diff=diff
        )
    except BaseException:
        sandbox.remove()
        raise
    return sandbox


# Each lease attempt starts from a new directory built from the checkpoint, so the
# working copy an attempt sees is always exactly the checkpointed state.
workspace_restore = workspace_ensure


def workspace_diff(sandbox: LocalSandbox, base_commit: str) -> Diff:
    """Everything changed since the base commit, new files included, as the platform
    computes it from the working copy's file contents."""
    if sandbox.git_dir is None:
        raise platform_git.PlatformGitError("the working copy has no platform repository")
    _, diff = platform_git.tree_build(
        git_dir=sandbox.git_dir, workdir=sandbox.path, base=base_commit
    )
    return diff
