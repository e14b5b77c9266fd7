"""The git provider interface. Every method is safe to call again after a crash."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from runs.agent import platform_git
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


class GitProvider(ABC):
    name: str

    def git_credentials(self, repository: Repository) -> tuple[dict[str, str], str]:
        """Git config that authenticates clone and push (e.g. an ``http.extraHeader``)
        and the secret in it, to redact from errors. Given only to the platform's own
        git processes, never to a sandbox or a file."""
        return {}, ""

    def branch_push(
        self, *, repository: Repository, git_dir: Path, commit: str, branch: str
    ) -> None:
        """Force ``commit`` of the platform repository onto ``branch`` of the remote.

        The branch belongs to the task: a repeated push after a crash may carry a re-made
        commit, so it is forced.
        """
        config, secret = self.git_credentials(repository)
        try:
            platform_git.commit_push(
                git_dir=git_dir,
                url=repository.clone_url,
                commit=commit,
                branch=branch,
                config=config,
                secret=secret,
            )
        except platform_git.PlatformGitError as exc:
            raise GitProviderError(
                f"push to {repository.name} failed: {exc}", retryable=True
            ) from exc

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
