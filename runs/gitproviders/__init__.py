"""Git providers behind one interface: publish a branch and open or update its PR."""

from __future__ import annotations

from runs.gitproviders.base import GitProvider, PullRequestInfo
from runs.gitproviders.github import GitHubProvider
from runs.gitproviders.gitlab import GitLabProvider
from runs.gitproviders.local import LocalGitProvider


def git_provider_for(provider: str) -> GitProvider:
    if provider == "local":
        return LocalGitProvider()
    if provider == "github":
        return GitHubProvider()
    if provider == "gitlab":
        return GitLabProvider()
    raise ValueError(f"no git provider for {provider!r}")


__all__ = ["GitProvider", "PullRequestInfo", "git_provider_for"]
