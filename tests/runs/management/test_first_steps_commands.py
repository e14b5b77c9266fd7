"""First steps from the command line on a fresh database, and GET /api/."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runs.models import Membership, Repository, Workspace

pytestmark = pytest.mark.django_db


def _call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def test_workspace_repository_and_token_from_nothing(sample_repo: Any) -> None:
    assert _call("workspace_create", "acme", "--admin", "alice") == "acme"
    repo_id = _call(
        "repository_add", "--workspace", "acme", "--name", "mine", "--clone-url", str(sample_repo)
    )
    token = _call("issue_token", "--user", "alice", "--workspace", "acme")

    repository = Repository.objects.get(pk=int(repo_id))
    assert (repository.workspace.slug, repository.provider) == ("acme", "local")
    assert Membership.objects.get(user__username="alice").role == "admin"
    listed = Client().get("/api/repositories/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert [r["id"] for r in listed.json()["results"]] == [repository.pk]


def test_commands_refuse_clearly_and_change_nothing() -> None:
    with pytest.raises(CommandError, match="workspace_create demo"):
        call_command("issue_token", "--user", "bob", "--workspace", "demo")
    with pytest.raises(CommandError, match="workspace_create nope"):
        call_command("repository_add", "--workspace", "nope", "--name", "x", "--clone-url", "/x")
    call_command("workspace_create", "acme", stdout=StringIO())
    with pytest.raises(CommandError, match="slug"):
        call_command("workspace_create", "acme", stdout=StringIO())
    with pytest.raises(CommandError, match="LOCAL_REPOSITORY_ROOTS"):
        call_command("repository_add", "--workspace", "acme", "--name", "x", "--clone-url", "/etc")
    assert Workspace.objects.count() == 1 and not Repository.objects.exists()


def test_api_root_lists_the_resources() -> None:
    response = Client().get("/api/")

    assert response.status_code == 200
    body = response.json()
    assert body["tasks"] == "http://testserver/api/tasks/"
    assert {"runs", "workspaces", "repositories", "tokens", "schema", "docs"} <= set(body)
    for url in body.values():
        assert Client().get(url.removeprefix("http://testserver")).status_code in (200, 401)


def test_uncollected_static_files_are_a_system_check_warning(settings: Any, tmp_path: Any) -> None:
    from django.core.checks import run_checks

    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    settings.STATIC_ROOT = tmp_path
    assert "agentplatform.W010" in [m.id for m in run_checks()]

    (tmp_path / "staticfiles.json").write_text("{}")
    assert "agentplatform.W010" not in [m.id for m in run_checks()]


def test_collectstatic_does_not_warn_about_the_files_it_collects(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    # The project's own settings: the test settings keep plain (unhashed) static storage.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
        "STATIC_ROOT": str(tmp_path / "static"),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "W010" not in done.stdout + done.stderr
    assert (tmp_path / "static" / "staticfiles.json").exists()
