"""A provider's token reaches that provider's configured hosts and no other, whatever the
clone URL says: real clones, pushes and REST calls against real local listeners that
record every header they are sent."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from runs import demo
from runs.agent import platform_git
from runs.agent.workspace import workspace_clone
from runs.engine import run_drive_inline
from runs.gitproviders.base import GitProviderError
from runs.gitproviders.github import GitHubProvider, github_slug
from runs.gitproviders.gitlab import GitLabProvider
from runs.models import Repository, Run
from runs.services import task_submit
from tests.factories import RepositoryFactory
from tests.runs.git_servers import RecordingGitServer

pytestmark = pytest.mark.django_db

TOKEN = "ghp_" + "ExfilCanary" * 4
# What each provider's git credential looks like on the wire.
BASIC = {
    "github": base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode(),
    "gitlab": base64.b64encode(f"oauth2:{TOKEN}".encode()).decode(),
}


@pytest.fixture
def servers() -> Iterator[list[RecordingGitServer]]:
    started: list[RecordingGitServer] = []
    yield started
    for server in started:
        server.close()


def _serve(servers: list[RecordingGitServer], **kwargs: object) -> RecordingGitServer:
    server = RecordingGitServer(**kwargs)  # type: ignore[arg-type]
    servers.append(server)
    return server


def _token_seen(server: RecordingGitServer) -> bool:
    secrets = (TOKEN, *BASIC.values())
    return any(s in value for r in server.requests for value in r.values() for s in secrets)


def _tokens(settings: object) -> None:
    settings.GITHUB_TOKEN = TOKEN  # type: ignore[attr-defined]
    settings.GITLAB_TOKEN = TOKEN  # type: ignore[attr-defined]


def _submit(workspace: object, repository: Repository) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    return Run.objects.get(pk=submission.run.id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("provider", ["github", "gitlab"])
def test_a_clone_url_on_a_foreign_host_never_sees_the_token(workspace, settings, servers, provider):
    _tokens(settings)
    listener = _serve(servers)
    repository = RepositoryFactory(
        workspace=workspace,
        provider=provider,
        external_id="octo/exfil",
        clone_url=f"{listener.origin}/octo/exfil.git",
    )

    run = run_drive_inline(run_id=_submit(workspace, repository).id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "clone_failed")
    assert listener.requests, "git never asked: the test proves nothing"
    assert not _token_seen(listener)
    assert not listener.header_values("authorization")


def test_a_push_to_a_foreign_host_never_sees_the_token(tmp_path, settings, servers):
    _tokens(settings)
    listener = _serve(servers)
    origin = demo.sample_repository_create(tmp_path / "origin")
    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    commit = platform_git.commit_resolve(git_dir, "origin/main")
    repository = SimpleNamespace(clone_url=f"{listener.origin}/octo/exfil.git", name="exfil")

    with pytest.raises(GitProviderError) as failed:
        GitHubProvider(token=TOKEN).branch_push(
            repository=repository,  # type: ignore[arg-type]
            git_dir=git_dir,
            commit=commit,
            branch="agent/abc",
        )

    assert listener.requests, (listener.connections, str(failed.value))
    assert not _token_seen(listener)


@pytest.mark.parametrize("provider", ["github", "gitlab"])
def test_the_configured_git_host_gets_the_token(workspace, settings, servers, tmp_path, provider):
    # A GitHub Enterprise / self-hosted GitLab: the git host is the API URL's host.
    _tokens(settings)
    root = tmp_path / "git-root"
    demo.sample_repository_create(root / "octo")
    server = _serve(servers, root=root)
    settings.GITHUB_API_URL = f"{server.origin}/api/v3"
    settings.GITLAB_API_URL = f"{server.origin}/api/v4"
    repository = RepositoryFactory(
        workspace=workspace,
        provider=provider,
        external_id="octo/calc",
        clone_url=f"{server.origin}/octo/calc.git",
    )

    sandbox, sha = workspace_clone(run=_submit(workspace, repository), ref="origin/main", attempt=1)

    assert len(sha) == 40 and (sandbox.path / "calc" / "core.py").is_file()
    assert f"Basic {BASIC[provider]}" in server.header_values("authorization")
    on_disk = [
        p
        for p in [*sandbox.path.rglob("*"), *Path(str(sandbox.git_dir)).rglob("*")]
        if p.is_file() and BASIC[provider].encode() in p.read_bytes()
    ]
    assert not on_disk


def test_a_redirect_from_the_configured_host_is_not_followed(workspace, settings, servers):
    # A redirect would take the request to an address nobody checked (curl itself drops
    # the header on a change of host, but not the connection).
    _tokens(settings)
    elsewhere = _serve(servers)
    configured = _serve(servers, redirect_to=elsewhere.origin)
    settings.GITHUB_GIT_HOSTS = [configured.origin]
    repository = RepositoryFactory(
        workspace=workspace,
        provider="github",
        external_id="octo/exfil",
        clone_url=f"{configured.origin}/octo/exfil.git",
    )

    with pytest.raises(platform_git.PlatformGitError):
        workspace_clone(run=_submit(workspace, repository), ref="origin/main", attempt=1)

    assert f"Basic {BASIC['github']}" in configured.header_values("authorization")
    assert not elsewhere.requests


@pytest.mark.parametrize(
    ("provider", "header"),
    [(GitHubProvider, "authorization"), (GitLabProvider, "private-token")],
)
def test_the_rest_client_sends_the_token_only_to_its_api_origin(servers, provider, header):
    api, foreign = _serve(servers), _serve(servers)

    with provider(api_url=f"{api.origin}/api", token=TOKEN)._client() as client:
        client.get("/repos/octo/x/pulls")
        # An absolute URL (e.g. a link a response handed back) to another origin.
        client.get(f"{foreign.origin}/repos/octo/x/pulls")
        client.get(f"http://localhost:{api.port}/repos/octo/x/pulls")

    assert [TOKEN in v for v in api.header_values(header)] == [True]
    assert foreign.requests and not _token_seen(foreign)


@pytest.mark.parametrize("external_id", ["../..", "octo/..", "octo/x?y", "octo/%2e%2e"])
def test_a_github_slug_cannot_steer_the_api_path(external_id):
    repository = Repository(name="x", provider="github", external_id=external_id, clone_url="")
    with pytest.raises(GitProviderError):
        github_slug(repository)
