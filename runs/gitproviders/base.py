"""The git provider interface. Every method is safe to call again after a crash."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from runs.agent.sandbox import LocalSandbox, SandboxError
from runs.models import Repository


class GitProviderError(Exception):
    """The git host failed; ``retryable`` says whether the saga step may be repeated."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class PullRequestInfo:
    number: int | None
    url: str
    head_sha: str
    created: bool


def branch_commit(*, sandbox: LocalSandbox, branch: str, message: str) -> str:
    """Commit the working copy on ``branch``; returns the commit sha. Repeatable."""
    for args in (("checkout", "-B", branch), ("add", "--all")):
        result = sandbox.git(*args)
        if not result.ok:
            raise SandboxError(f"git {' '.join(args)} failed: {result.output[:500]}")
    staged = sandbox.git("diff", "--cached", "--quiet")
    if staged.exit_code == 1:
        result = sandbox.git("commit", "--quiet", "-m", message)
        if not result.ok:
            raise SandboxError(f"git commit failed: {result.output[:500]}")
    return sandbox.git("rev-parse", "HEAD").output.strip()


class GitProvider(ABC):
    name: str

    @abstractmethod
    def branch_push(self, *, repository: Repository, sandbox: LocalSandbox, branch: str) -> None:
        """Push the sandbox's HEAD to ``branch`` of the repository's remote."""

    @abstractmethod
    def pull_request_ensure(
        self,
        *,
        repository: Repository,
        branch: str,
        base_branch: str,
        title: str,
        body: str,
        head_sha: str,
    ) -> PullRequestInfo:
        """Find the PR for ``branch`` or open it; never opens a second one."""
