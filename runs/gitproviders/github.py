"""GitHub: push the task's branch and open (or update) its draft pull request.

Every call is safe to repeat. The pull request is looked up by its head branch before
one is created, and a "pull request already exists" refusal (HTTP 422) is answered by
looking it up again, so a crash between GitHub creating the PR and our database
recording it ends with the existing PR reconciled, never a second one.

The token never reaches the sandbox. The branch is pushed from a scratch repository the
platform owns: objects are fetched out of the working copy (whose git configuration
the agent could have changed, e.g. an ``insteadOf`` rewrite or a hook path) and pushed
from the scratch repository with the credential passed to that one git process through
its environment, so it appears in no command line, no remote URL and no file.
"""

from __future__ import annotations

import base64
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from django.conf import settings

from runs.agent.sandbox import LocalSandbox
from runs.gitproviders.base import GitProvider, GitProviderError, PullRequestInfo
from runs.models import Repository

API_VERSION = "2022-11-28"
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_ATTEMPTS = 4


def github_slug(repository: Repository) -> tuple[str, str]:
    """``(owner, name)`` from the external id or the clone URL."""
    slug = repository.external_id
    if not slug:
        path = urlparse(repository.clone_url).path or repository.clone_url
        slug = path.split(":")[-1]
    match = re.fullmatch(r"/?([^/]+)/([^/]+?)(?:\.git)?/?", slug)
    if not match:
        raise GitProviderError(f"cannot tell owner/name of {repository.name!r}", retryable=False)
    return match.group(1), match.group(2)


def _git_env(extra_config: dict[str, str]) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": tempfile.gettempdir(),
        "GIT_CONFIG_COUNT": str(len(extra_config)),
    }
    for index, (key, value) in enumerate(extra_config.items()):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def branch_push_isolated(
    *, sandbox: LocalSandbox, url: str, branch: str, token: str = "", timeout: float = 300
) -> None:
    """Push the sandbox's HEAD to ``branch`` at ``url`` from a platform-owned repository."""
    root = Path(settings.SANDBOX_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="push-", dir=root))
    config = {"core.hooksPath": os.devnull}
    try:
        steps: list[tuple[list[str], dict[str, str]]] = [
            (["git", "init", "--quiet", "--bare", str(scratch)], {}),
            (
                [
                    "git",
                    "-C",
                    str(scratch),
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    str(sandbox.path.resolve()),
                    f"+HEAD:refs/heads/{branch}",
                ],
                {},
            ),
        ]
        push_config = dict(config)
        if token:
            basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
            push_config["http.extraHeader"] = f"Authorization: Basic {basic}"
        steps.append(
            (
                [
                    "git",
                    "-C",
                    str(scratch),
                    "push",
                    "--quiet",
                    "--force",
                    url,
                    f"refs/heads/{branch}:refs/heads/{branch}",
                ],
                push_config,
            )
        )
        for argv, extra in steps:
            try:
                result = subprocess.run(
                    argv,
                    env=_git_env({**config, **extra}),
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise GitProviderError(f"{argv[3]} timed out", retryable=True) from exc
            if result.returncode != 0:
                message = result.stderr.decode("utf-8", "replace").strip()
                if token:
                    message = message.replace(token, "[REDACTED]")
                raise GitProviderError(f"git {argv[3]} failed: {message[:500]}", retryable=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class GitHubProvider(GitProvider):
    name = "github"

    def __init__(
        self, *, api_url: str | None = None, token: str | None = None, backoff_seconds: float = 1.0
    ) -> None:
        self.api_url = (api_url or settings.GITHUB_API_URL).rstrip("/")
        self.token = settings.GITHUB_TOKEN if token is None else token
        self.backoff_seconds = backoff_seconds

    # --- git -------------------------------------------------------------------------

    def branch_push(self, *, repository: Repository, sandbox: LocalSandbox, branch: str) -> None:
        branch_push_isolated(
            sandbox=sandbox, url=repository.clone_url, branch=branch, token=self.token
        )

    # --- REST ------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "agentplatform",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return httpx.Client(
            base_url=self.api_url, headers=headers, timeout=settings.GITHUB_TIMEOUT_SECONDS
        )

    def _request(
        self, client: httpx.Client, method: str, path: str, **kwargs: Any
    ) -> httpx.Response:
        """One API call; rate limits, 5xx and network trouble are retried with jitter."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                response = client.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt == MAX_ATTEMPTS:
                    raise GitProviderError(f"GitHub unreachable: {exc}", retryable=True) from exc
            else:
                if response.status_code not in RETRYABLE_STATUS:
                    return response
                if attempt == MAX_ATTEMPTS:
                    raise GitProviderError(
                        f"GitHub {method} {path}: HTTP {response.status_code}", retryable=True
                    )
            time.sleep(random.uniform(0, self.backoff_seconds * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

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
        """The open pull request whose head is ``owner:branch``, if there is one."""
        response = self._request(
            client,
            "GET",
            f"/repos/{owner}/{name}/pulls",
            params={"head": f"{owner}:{branch}", "state": "open"},
        )
        self._raise_for(response, "look up the pull request")
        pulls = response.json()
        return pulls[0] if pulls else None

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
        response = self._request(
            client,
            "PATCH",
            f"/repos/{owner}/{name}/pulls/{pull['number']}",
            json={"title": title, "body": body},
        )
        self._raise_for(response, "update the pull request")
        return self._info(response.json(), head_sha, created=False)

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
