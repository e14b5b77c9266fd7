"""The local provider: pushes the branch to the repository's origin (e.g. a bare
repository on disk) and records the pull request in the database only."""

from __future__ import annotations

from runs.gitproviders.base import GitProvider, PullRequestInfo
from runs.models import PullRequest, Repository


class LocalGitProvider(GitProvider):
    name = "local"

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
        existing = (
            PullRequest.objects.filter(task__repository=repository, branch=branch, provider="local")
            .exclude(number=None)
            .first()
        )
        if existing is not None:
            return PullRequestInfo(existing.number, existing.url, head_sha, created=False)
        number = PullRequest.objects.filter(task__repository=repository).count() + 1
        url = f"local://{repository.name}/pulls/{number}?branch={branch}"
        return PullRequestInfo(number, url, head_sha, created=True)
