"""GitLab: push the task's branch and open (or update) its draft merge request.

The same guarantees as GitHub's provider: every call is safe to repeat. The merge
request is looked up by its source branch before one is created, and GitLab's refusal
of a second open merge request for a branch (HTTP 409) is answered by looking it up
again, so a crash or a lost answer after GitLab created it ends with the existing one
reconciled, never a duplicate. The branch is pushed by the platform's own git (see
``GitProvider.branch_push``) with the credentials below; the API is called with a
``PRIVATE-TOKEN`` header.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlparse

import httpx
from django.conf import settings

from runs.gitproviders.base import (
    RETRYABLE_STATUS,
    GitProvider,
    GitProviderError,
    PullRequestInfo,
    api_request,
)
from runs.gitproviders.credentials import OriginScopedAuth, git_basic_credentials
from runs.models import Repository

DRAFT_PREFIX = "Draft: "


def gitlab_project_path(repository: Repository) -> str:
    """``group/subgroup/name`` from the external id or the clone URL."""
    path = repository.external_id
    if not path:
        parsed = urlparse(repository.clone_url)
        path = parsed.path if parsed.scheme else repository.clone_url.split(":", 1)[-1]
    path = re.sub(r"\.git/?$", "", path.strip("/"))
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)+", path):
        raise GitProviderError(
            f"cannot tell the GitLab project of {repository.name!r}", retryable=False
        )
    return path


class GitLabProvider(GitProvider):
    name = "gitlab"

    def __init__(
        self, *, api_url: str | None = None, token: str | None = None, backoff_seconds: float = 1.0
    ) -> None:
        self.api_url = (api_url or settings.GITLAB_API_URL).rstrip("/")
        self.token = settings.GITLAB_TOKEN if token is None else token
        self.backoff_seconds = backoff_seconds

    def git_credentials(self, repository: Repository) -> tuple[dict[str, str], str]:
        # GitLab takes a token as the password of HTTP basic auth with user "oauth2";
        # only for GitLab's own git hosts, whatever the clone URL names.
        return git_basic_credentials(
            provider="gitlab", url=repository.clone_url, username="oauth2", token=self.token
        )

    def _client(self) -> httpx.Client:
        auth = None
        if self.token:
            auth = OriginScopedAuth(api_url=self.api_url, header="PRIVATE-TOKEN", value=self.token)
        return httpx.Client(
            base_url=self.api_url,
            headers={"User-Agent": "agentplatform"},
            auth=auth,
            timeout=settings.GITLAB_TIMEOUT_SECONDS,
        )

    def _request(
        self, client: httpx.Client, method: str, path: str, **kwargs: Any
    ) -> httpx.Response:
        return api_request(
            client,
            method,
            path,
            service="GitLab",
            backoff_seconds=self.backoff_seconds,
            **kwargs,
        )

    def comment_post(
        self, *, repository: Repository, number: int, body: str, merge_request: bool = False
    ) -> None:
        project = quote(gitlab_project_path(repository), safe="")
        kind = "merge_requests" if merge_request else "issues"
        with self._client() as client:
            response = self._request(
                client, "POST", f"/projects/{project}/{kind}/{number}/notes", json={"body": body}
            )
        self._raise_for(response, "comment")

    @staticmethod
    def _raise_for(response: httpx.Response, doing: str) -> None:
        if response.is_success:
            return
        retryable = response.status_code in RETRYABLE_STATUS
        raise GitProviderError(
            f"GitLab refused to {doing}: HTTP {response.status_code} {response.text[:300]}",
            retryable=retryable,
        )

    @staticmethod
    def _info(merge_request: dict[str, Any], head_sha: str, *, created: bool) -> PullRequestInfo:
        return PullRequestInfo(
            number=int(merge_request["iid"]),
            url=str(merge_request.get("web_url", "")),
            head_sha=head_sha,
            created=created,
        )

    def merge_request_find(
        self, client: httpx.Client, project: str, branch: str, base_branch: str
    ) -> dict[str, Any] | None:
        response = self._request(
            client,
            "GET",
            f"/projects/{quote(project, safe='')}/merge_requests",
            params={"source_branch": branch, "target_branch": base_branch, "state": "opened"},
        )
        self._raise_for(response, "look up the merge request")
        found = response.json()
        return found[0] if found else None

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
        project = gitlab_project_path(repository)
        draft_title = title if title.startswith(DRAFT_PREFIX) else DRAFT_PREFIX + title
        with self._client() as client:
            existing = self.merge_request_find(client, project, branch, base_branch)
            if existing is not None:
                return self._update(client, project, existing, draft_title, body, head_sha)
            response = self._request(
                client,
                "POST",
                f"/projects/{quote(project, safe='')}/merge_requests",
                json={
                    "source_branch": branch,
                    "target_branch": base_branch,
                    "title": draft_title,
                    "description": body,
                    "remove_source_branch": True,
                },
            )
            if response.status_code == 409:
                # Opened by an earlier attempt whose answer was lost: reconcile.
                existing = self.merge_request_find(client, project, branch, base_branch)
                if existing is not None:
                    return self._update(client, project, existing, draft_title, body, head_sha)
            self._raise_for(response, "open the merge request")
            return self._info(response.json(), head_sha, created=True)

    def _update(
        self,
        client: httpx.Client,
        project: str,
        merge_request: dict[str, Any],
        title: str,
        body: str,
        head_sha: str,
    ) -> PullRequestInfo:
        response = self._request(
            client,
            "PUT",
            f"/projects/{quote(project, safe='')}/merge_requests/{merge_request['iid']}",
            json={"title": title, "description": body},
        )
        self._raise_for(response, "update the merge request")
        return self._info(response.json(), head_sha, created=False)
