"""Clone URLs are registered safely: https/ssh for workspace admins, local paths only for
staff and only under LOCAL_REPOSITORY_ROOTS, an optional host allowlist, no credentials
in URLs; the rules are checked again before every clone."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Membership, Repository, Run
from runs.repositories import CloneUrlRefused, clone_url_check
from runs.services import task_submit
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    ours, theirs = WorkspaceFactory(slug="ours"), WorkspaceFactory(slug="theirs")
    user = UserFactory()
    Membership.objects.create(workspace=ours, user=user, role="admin")
    client = APIClient()
    client.force_authenticate(user)
    return client, ours, theirs


def _register(client: APIClient, clone_url: str, provider: str = "github", name: str = "r"):
    return client.post(
        "/api/repositories/",
        {"workspace": "ours", "name": name, "provider": provider, "clone_url": clone_url},
        format="json",
    )


def test_another_workspaces_local_path_is_refused(admin_client, tmp_path):
    client, _, theirs = admin_client
    private = demo.sample_repository_create(tmp_path / "theirs")
    RepositoryFactory(workspace=theirs, clone_url=str(private))

    for url in (str(private), f"file://{private}", f"{tmp_path}/theirs/../theirs/origin.git"):
        for provider in ("github", "gitlab", "local"):
            response = _register(client, url, provider)
            assert response.status_code == 400, (url, provider, response.content)
            assert "clone_url" in response.json()["errors"] or "clone_url" in str(response.json())
    assert not Repository.objects.filter(workspace__slug="ours").exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://github.com/octo/x.git",
        "git://github.com/octo/x.git",
        "https://user:ghp_secret@github.com/octo/x.git",
        "ext::sh -c id",
        "--upload-pack=id",
        "https:///nohost",
    ],
)
def test_unsafe_remote_urls_are_refused(admin_client, url):
    client, _, _ = admin_client
    response = _register(client, url)
    assert response.status_code == 400, response.content
    assert not Repository.objects.filter(workspace__slug="ours").exists()


@pytest.mark.parametrize("url", ["https://github.com/octo/x.git", "git@github.com:octo/x.git"])
def test_https_and_configured_ssh_are_accepted(admin_client, settings, url):
    client, _, _ = admin_client
    settings.GIT_ALLOWED_SCHEMES = ["https", "ssh"]
    assert _register(client, url).status_code == 201


@pytest.mark.parametrize("url", ["git@github.com:octo/x.git", "ssh://git@github.com/octo/x.git"])
def test_ssh_is_refused_unless_configured(admin_client, settings, url):
    # ssh offers the worker's own keys to whatever host the URL names.
    client, _, _ = admin_client
    settings.GIT_ALLOWED_SCHEMES = ["https"]
    response = _register(client, url)
    assert response.status_code == 400, response.content
    assert "GIT_ALLOWED_SCHEMES" in str(response.json()) or "https" in str(response.json())


def test_the_host_allowlist(admin_client, settings):
    client, _, _ = admin_client
    settings.GIT_ALLOWED_SCHEMES = ["https", "ssh"]
    settings.REPOSITORY_HOST_ALLOWLIST = ["github.com"]
    assert _register(client, "https://evil.example/x.git", name="a").status_code == 400
    assert _register(client, "git@evil.example:x.git", name="b").status_code == 400
    assert _register(client, "https://github.com/octo/x.git", name="c").status_code == 201


def test_staff_local_paths_only_under_the_roots(settings, tmp_path):
    inside = tmp_path / "allowed" / "repo.git"
    inside.mkdir(parents=True)
    settings.LOCAL_REPOSITORY_ROOTS = [str(tmp_path / "allowed")]
    clone_url_check(str(inside), staff=True)
    clone_url_check(f"file://{inside}", staff=True)
    for outside in (str(tmp_path / "other"), f"{tmp_path}/allowed/../other", "/etc", "relative"):
        with pytest.raises(CloneUrlRefused):
            clone_url_check(outside, staff=True)
    link = tmp_path / "allowed" / "link"
    link.symlink_to("/etc")
    with pytest.raises(CloneUrlRefused):
        clone_url_check(str(link), staff=True)


@pytest.mark.django_db(transaction=True)
def test_a_row_written_around_the_api_is_not_cloned(workspace, settings, tmp_path):
    settings.LOCAL_REPOSITORY_ROOTS = [str(tmp_path / "allowed")]
    outside = demo.sample_repository_create(tmp_path / "elsewhere")
    repository = RepositoryFactory(workspace=workspace, provider="github", clone_url=str(outside))
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "clone_failed")
    assert "LOCAL_REPOSITORY_ROOTS" in run.failure_detail
    assert not list(Path(settings.PLATFORM_GIT_ROOT).glob(f"run-{run.id}*"))
