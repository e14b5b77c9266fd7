"""Git providers behind one interface: publish a branch and open or update its PR."""

from __future__ import annotations

from runs.gitproviders.base import GitProvider, PullRequestInfo


def git_provider_for(provider: str) -> GitProvider:
    if provider == "local":
        from runs.gitproviders.local import LocalGitProvider

        return LocalGitProvider()
    if provider == "github":
        from runs.gitproviders.github import GitHubProvider

        return GitHubProvider()
    if provider == "gitlab":
        from runs.gitproviders.gitlab import GitLabProvider

        return GitLabProvider()
    raise ValueError(f"no git provider for {provider!r}")


__all__ = ["GitProvider", "PullRequestInfo", "git_provider_for"]
