"""The local provider: pushes the branch to the repository's origin (e.g. a bare
repository on disk) and records the pull request in the database only."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from runs.gitproviders.base import GitProvider, PullRequestInfo
from runs.models import PullRequest, Repository


def _number_allocate(repository: Repository) -> int:
    """The repository's next pull request number, never handed out twice.

    Counting the existing rows gave two concurrent runs the same number (neither row
    existed yet); the repository's row lock serialises allocations, and the counter
    remembers numbers whose row a crash never wrote.
    """
    with transaction.atomic():
        locked = Repository.objects.select_for_update().get(pk=repository.pk)
        highest = PullRequest.objects.filter(task__repository=locked, provider="local").aggregate(
            n=Max("number")
        )["n"]
        number = max(locked.local_pr_seq, highest or 0) + 1
        Repository.objects.filter(pk=locked.pk).update(local_pr_seq=number)
    return number


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
        number = _number_allocate(repository)
        url = f"local://{repository.name}/pulls/{number}?branch={branch}"
        return PullRequestInfo(number, url, head_sha, created=True)
