"""The git provider interface. Every method is safe to call again after a crash."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from runs import ratelimits
from runs.agent import platform_git
from runs.models import Repository
from runs.repositories import CloneUrlRefused, clone_url_check_before_use

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_ATTEMPTS = 4


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
        self,
        *,
        repository: Repository,
        git_dir: Path,
        commit: str,
        branch: str,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        """Force ``commit`` of the platform repository onto ``branch`` of the remote.

        The branch belongs to the task: a repeated push after a crash may carry a re-made
        commit, so it is forced. The clone URL is checked again (a row written around
        the API, a rule added since), and a cancelled run stops the push (GitStopped).
        """
        try:
            clone_url_check_before_use(repository.clone_url)
        except CloneUrlRefused as exc:
            raise GitProviderError(f"push refused: {exc}", retryable=False) from exc
        config, secret = self.git_credentials(repository)
        try:
            platform_git.commit_push(
                git_dir=git_dir,
                url=repository.clone_url,
                commit=commit,
                branch=branch,
                config=config,
                secret=secret,
                should_stop=should_stop,
            )
        except platform_git.GitStopped:
            raise
        except platform_git.GitRemoteRefused as exc:
            raise GitProviderError(f"push refused: {exc}", retryable=False) from exc
        except platform_git.PlatformGitError as exc:
            raise GitProviderError(
                f"push to {repository.name} failed: {exc}", retryable=True
            ) from exc

    def comment_post(
        self, *, repository: Repository, number: int, body: str, merge_request: bool = False
    ) -> None:
        """Comment on issue (or pull/merge request) ``number`` of the repository."""
        raise GitProviderError(f"the {self.name} provider cannot comment", retryable=False)

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


def api_request(
    client: httpx.Client,
    method: str,
    path: str,
    *,
    service: str,
    backoff_seconds: float,
    **kwargs: Any,
) -> httpx.Response:
    """One call to a git host's REST API; rate limits, 5xx and network trouble are
    retried with full jitter, and what still fails is a retryable GitProviderError."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            ratelimits.git_acquire(service, client.base_url.host)
            response = client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            if attempt == MAX_ATTEMPTS:
                raise GitProviderError(f"{service} unreachable: {exc}", retryable=True) from exc
        else:
            if response.status_code not in RETRYABLE_STATUS:
                return response
            if attempt == MAX_ATTEMPTS:
                raise GitProviderError(
                    f"{service} {method} {path}: HTTP {response.status_code}", retryable=True
                )
        time.sleep(random.uniform(0, backoff_seconds * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")
