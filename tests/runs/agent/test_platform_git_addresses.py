"""Every clone and push resolves its host right before git connects, refuses the
platform's own network, and connects to the address it checked: real git processes
against real listeners that count the connections they get."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from runs import demo
from runs.agent import platform_git
from runs.agent.workspace import workspace_clone
from runs.engine import run_drive_inline
from runs.git_network import AddressRefused, endpoint_check, endpoint_of
from runs.gitproviders.base import GitProviderError
from runs.gitproviders.github import GitHubProvider
from runs.models import Run
from runs.repositories import clone_url_check
from runs.services import task_submit
from tests.factories import RepositoryFactory
from tests.runs.git_servers import BlackHole, RecordingGitServer

pytestmark = pytest.mark.django_db

real_getaddrinfo = socket.getaddrinfo


@pytest.fixture
def production_rules(settings):
    """No internal host allowed (the test settings allow the tests' own servers)."""
    settings.GIT_INTERNAL_HOSTS = []
    settings.GIT_INTERNAL_NETWORKS = []
    settings.GIT_ALLOWED_SCHEMES = ["https", "http", "ssh"]
    return settings


@pytest.fixture
def listeners() -> Iterator[dict[str, Any]]:
    started: dict[str, Any] = {}
    yield started
    for listener in started.values():
        listener.close()


@pytest.fixture
def dns(monkeypatch) -> dict[str, list[str]]:
    """Names this process resolves as the test says (git's own processes cannot)."""
    answers: dict[str, list[str]] = {}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))
                for address in answers[host]
            ]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def _run(workspace: Any, clone_url: str) -> Run:
    repository = RepositoryFactory(
        workspace=workspace, provider="github", external_id="octo/x", clone_url=clone_url
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    return Run.objects.get(pk=submission.run.id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{port}/octo/x.git",
        "http://localhost:{port}/octo/x.git",
        "https://127.0.0.1:{port}/octo/x.git",
        "ssh://git@127.0.0.1:{port}/octo/x.git",
    ],
)
def test_a_row_written_around_the_api_cannot_reach_loopback(
    workspace, production_rules, listeners, template
):
    listener = listeners["hole"] = BlackHole()
    run = _run(workspace, template.format(port=listener.port))

    run = run_drive_inline(run_id=run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "clone_failed")
    assert "loopback" in run.failure_detail
    assert not listener.accepted


def test_the_address_is_checked_again_right_before_the_clone(
    workspace, production_rules, listeners, dns
):
    listener = listeners["git"] = RecordingGitServer()
    url = f"http://moving.example:{listener.port}/octo/x.git"
    dns["moving.example"] = ["93.184.216.34"]
    clone_url_check(url, staff=True)  # registered while it pointed outside
    dns["moving.example"] = ["127.0.0.1"]

    with pytest.raises(platform_git.PlatformGitError, match="loopback"):
        workspace_clone(run=_run(workspace, url), ref="origin/main", attempt=1)

    assert listener.connections == 0


def test_git_connects_to_the_address_that_was_checked(
    workspace, settings, listeners, dns, tmp_path
):
    # git's own resolver never sees this name: the clone works only if git is pinned to
    # the address this process checked.
    root = tmp_path / "git-root"
    demo.sample_repository_create(root / "octo")
    server = listeners["git"] = RecordingGitServer(root=root)
    settings.GIT_INTERNAL_HOSTS = ["pinned.example"]
    dns["pinned.example"] = ["127.0.0.1"]
    url = f"http://pinned.example:{server.port}/octo/calc.git"

    sandbox, sha = workspace_clone(run=_run(workspace, url), ref="origin/main", attempt=1)

    assert len(sha) == 40 and (sandbox.path / "calc" / "core.py").is_file()
    assert {r["host"] for r in server.requests} == {f"pinned.example:{server.port}"}


def test_ssh_connects_to_the_address_that_was_checked(settings, dns, tmp_path):
    hole = BlackHole()
    settings.GIT_ALLOWED_SCHEMES = ["ssh"]
    settings.GIT_INTERNAL_HOSTS = ["pinned.example"]
    settings.GIT_NETWORK_TIMEOUT_SECONDS = 2
    dns["pinned.example"] = ["127.0.0.1"]
    try:
        with pytest.raises(platform_git.PlatformGitError, match="timed out"):
            platform_git.repository_fetch(
                url=f"ssh://git@pinned.example:{hole.port}/octo/x.git", dest=tmp_path / "p.git"
            )
        assert hole.accepted  # ssh reached the checked address, not its own lookup
    finally:
        hole.close()


def test_a_name_with_one_internal_address_among_public_ones_is_refused(production_rules, dns):
    dns["mixed.example"] = ["93.184.216.34", "169.254.169.254"]
    endpoint = endpoint_of("https://mixed.example/octo/x.git")
    assert endpoint is not None

    with pytest.raises(AddressRefused, match="metadata"):
        endpoint_check(endpoint)


def test_a_push_to_an_internal_address_is_refused(production_rules, listeners, tmp_path):
    listener = listeners["git"] = RecordingGitServer()
    origin = demo.sample_repository_create(tmp_path / "origin")
    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    commit = platform_git.commit_resolve(git_dir, "origin/main")

    with pytest.raises(platform_git.PlatformGitError, match="loopback"):
        platform_git.commit_push(
            git_dir=git_dir,
            url=f"http://127.0.0.1:{listener.port}/octo/x.git",
            commit=commit,
            branch="agent/x",
        )

    assert listener.connections == 0


def test_a_push_refused_by_address_is_not_retried(production_rules, tmp_path):
    origin = demo.sample_repository_create(tmp_path / "origin")
    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    repository = SimpleNamespace(clone_url="https://localhost/octo/x.git", name="x")

    with pytest.raises(GitProviderError, match="loopback") as refused:
        GitHubProvider(token="").branch_push(
            repository=repository,  # type: ignore[arg-type]
            git_dir=git_dir,
            commit=platform_git.commit_resolve(git_dir, "origin/main"),
            branch="agent/x",
        )

    assert refused.value.retryable is False


def test_a_scheme_the_operator_did_not_allow_is_refused_when_used(workspace, settings, listeners):
    # Allowed host, but plain http is off: a row from before the rule is not cloned.
    listener = listeners["git"] = RecordingGitServer()
    settings.GIT_ALLOWED_SCHEMES = ["https"]

    run = run_drive_inline(
        run_id=_run(workspace, f"http://127.0.0.1:{listener.port}/octo/x.git").id
    )

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "clone_failed")
    assert listener.connections == 0


def test_a_transport_helper_never_runs(tmp_path):
    marker = tmp_path / "ran"

    with pytest.raises(platform_git.PlatformGitError):
        platform_git.repository_fetch(url=f"ext::sh -c touch% {marker}", dest=tmp_path / "p.git")

    assert not marker.exists()
