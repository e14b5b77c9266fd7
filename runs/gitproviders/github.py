"""GitHub: push the task's branch and open (or update) its draft pull request.

Every call is safe to repeat. The pull request is looked up by its head branch before
one is created, and a "pull request already exists" refusal (HTTP 422) is answered by
looking it up again, so a crash between GitHub creating the PR and our database
recording it ends with the existing PR reconciled, never a second one.

The token never reaches the sandbox: clone and push run from the platform's own
repository (``runs.agent.platform_git``), with the credential passed to those git
processes as configuration in their environment, so it appears in no command line, no
remote URL and no file.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import httpx
from django.conf import settings

from runs.gitproviders.base import (
    GitProvider,
    GitProviderError,
    PullRequestInfo,
    api_request,
)
from runs.gitproviders.credentials import OriginScopedAuth, git_basic_credentials
from runs.models import Repository

API_VERSION = "2022-11-28"


def github_slug(repository: Repository) -> tuple[str, str]:
    """``(owner, name)`` from the external id or the clone URL."""
    slug = repository.external_id
    if not slug:
        path = urlparse(repository.clone_url).path or repository.clone_url
        slug = path.split(":")[-1]
    # GitHub's own alphabet: nothing that could steer the API path (``..``, ``?``, ``%``).
    match = re.fullmatch(r"/?([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?", slug)
    if not match or "" in (match.group(1).strip("."), match.group(2).strip(".")):
        raise GitProviderError(f"cannot tell owner/name of {repository.name!r}", retryable=False)
    return match.group(1), match.group(2)


class GitHubProvider(GitProvider):
    name = "github"

    def __init__(
        self, *, api_url: str | None = None, token: str | None = None, backoff_seconds: float = 1.0
    ) -> None:
        self.api_url = (api_url or settings.GITHUB_API_URL).rstrip("/")
        self.token = settings.GITHUB_TOKEN if token is None else token
        self.backoff_seconds = backoff_seconds

    # --- git -------------------------------------------------------------------------

    def git_credentials(self, repository: Repository) -> tuple[dict[str, str], str]:
        # Only for GitHub's own git hosts, whatever the clone URL names.
        return git_basic_credentials(
            provider="github", url=repository.clone_url, username="x-access-token", token=self.token
        )

    # --- REST ------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "agentplatform",
        }
        auth = None
        if self.token:
            auth = OriginScopedAuth(
                api_url=self.api_url, header="Authorization", value=f"Bearer {self.token}"
            )
        return httpx.Client(
            base_url=self.api_url,
            headers=headers,
            auth=auth,
            timeout=settings.GITHUB_TIMEOUT_SECONDS,
        )

    def _request(
        self, client: httpx.Client, method: str, path: str, **kwargs: Any
    ) -> httpx.Response:
        return api_request(
            client,
            method,
            path,
            service="GitHub",
            backoff_seconds=self.backoff_seconds,
            **kwargs,
        )

    @staticmethod
    def _info(pull: dict[str, Any], head_sha: str, *, created: bool) -> PullRequestInfo:
        return PullRequestInfo(
            number=int(pull["number"]),
            url=str(pull.get("html_url", "")),
            head_sha=head_sha,
            created=created,
        )

    def pull_request_find(
        self, client: httpx.Client, owner: str, name: str, branch: str
    ) -> dict[str, Any] | None:
        """The newest pull request whose head is ``owner:branch``, open, closed or merged.

        Asking only for open ones would miss a closed PR and open a second one for the
        same task (and overwrite the stored number).
        """
        response = self._request(
            client,
            "GET",
            f"/repos/{owner}/{name}/pulls",
            params={"head": f"{owner}:{branch}", "state": "all", "sort": "created"},
        )
        self._raise_for(response, "look up the pull request")
        pulls = response.json()
        if not pulls:
            return None
        return max(pulls, key=lambda pull: int(pull.get("number") or 0))

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
        owner, name = github_slug(repository)
        with self._client() as client:
            existing = self.pull_request_find(client, owner, name, branch)
            if existing is not None:
                return self._update(client, owner, name, existing, title, body, head_sha)
            response = self._request(
                client,
                "POST",
                f"/repos/{owner}/{name}/pulls",
                json={
                    "title": title,
                    "head": branch,
                    "base": base_branch,
                    "body": body,
                    "draft": True,
                },
            )
            if response.status_code == 422 and "already exists" in response.text:
                # Created by an earlier attempt whose answer we never saw, or the lookup
                # raced with it: reconcile instead of duplicating.
                existing = self.pull_request_find(client, owner, name, branch)
                if existing is not None:
                    return self._update(client, owner, name, existing, title, body, head_sha)
            self._raise_for(response, "open the pull request")
            return self._info(response.json(), head_sha, created=True)

    def _update(
        self,
        client: httpx.Client,
        owner: str,
        name: str,
        pull: dict[str, Any],
        title: str,
        body: str,
        head_sha: str,
    ) -> PullRequestInfo:
        """Update the task's pull request; a closed one is reopened, a merged one refused.

        One pull request per task (docs/design.md §6): a follow-up after a reviewer closed the PR
        brings that PR back rather than opening another; after a merge the branch is
        history, so new work on it must be a new task.
        """
        if pull.get("merged_at") or pull.get("merged"):
            raise GitProviderError(
                f"pull request #{pull['number']} was already merged; start a new task "
                "for further changes",
                retryable=False,
            )
        changes: dict[str, Any] = {"title": title, "body": body}
        if pull.get("state") == "closed":
            changes["state"] = "open"
        response = self._request(
            client,
            "PATCH",
            f"/repos/{owner}/{name}/pulls/{pull['number']}",
            json=changes,
        )
        self._raise_for(response, "update the pull request")
        return self._info(response.json(), head_sha, created=False)

    def comment_post(
        self, *, repository: Repository, number: int, body: str, merge_request: bool = False
    ) -> None:
        # Pull requests are issues to GitHub's comment API.
        owner, name = github_slug(repository)
        with self._client() as client:
            response = self._request(
                client,
                "POST",
                f"/repos/{owner}/{name}/issues/{number}/comments",
                json={"body": body},
            )
        self._raise_for(response, "comment")

    @staticmethod
    def _raise_for(response: httpx.Response, doing: str) -> None:
        if response.is_success:
            return
        try:
            message = response.json().get("message", "")
        except ValueError:
            message = response.text[:200]
        raise GitProviderError(
            f"GitHub refused to {doing}: HTTP {response.status_code} {message}", retryable=False
        )
