"""A network git operation that never gets an answer ends at its time limit or when its
run is cancelled, with every process it started; the worker slot it held is free again.
Real git, ssh and curl against a listener that accepts connections and says nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from runs import demo
from runs.agent import platform_git
from runs.models import Run
from runs.services import run_cancel_request, task_submit
from tests.conftest import processes_with, wait_for
from tests.factories import RepositoryFactory
from tests.runs.git_servers import BlackHole

URLS = ["https://127.0.0.1:{port}/octo/x.git", "ssh://git@127.0.0.1:{port}/octo/x.git"]


@pytest.fixture
def hole() -> Iterator[BlackHole]:
    listener = BlackHole()
    yield listener
    listener.close()


@pytest.fixture
def ssh_allowed(settings):
    settings.GIT_ALLOWED_SCHEMES = ["https", "ssh"]
    return settings


def _git_processes(port: int) -> list[int]:
    # git and git-remote-https carry the URL; ssh gets the port as "-p <port>".
    return processes_with(f"127.0.0.1:{port}/") + processes_with(f"-p\x00{port}\x00")


@pytest.mark.no_services
@pytest.mark.timeout(60)
@pytest.mark.parametrize("template", URLS)
def test_a_clone_that_gets_no_answer_ends_at_the_time_limit(ssh_allowed, hole, tmp_path, template):
    ssh_allowed.GIT_NETWORK_TIMEOUT_SECONDS = 2
    started = time.monotonic()

    with pytest.raises(platform_git.PlatformGitError, match="timed out after 2s"):
        platform_git.repository_fetch(
            url=template.format(port=hole.port), dest=tmp_path / "platform.git"
        )

    assert time.monotonic() - started < 8
    assert hole.accepted, "git never connected: the test proves nothing"
    assert not _git_processes(hole.port)
    assert not (tmp_path / "platform.git").exists()


@pytest.mark.no_services
@pytest.mark.timeout(60)
@pytest.mark.parametrize("template", URLS)
def test_a_clone_that_gets_no_answer_stops_when_asked(ssh_allowed, hole, tmp_path, template):
    ssh_allowed.GIT_NETWORK_TIMEOUT_SECONDS = 300
    asked = time.monotonic() + 1

    with pytest.raises(platform_git.GitStopped):
        platform_git.repository_fetch(
            url=template.format(port=hole.port),
            dest=tmp_path / "platform.git",
            should_stop=lambda: time.monotonic() > asked,
        )

    assert time.monotonic() - asked < 3
    assert hole.accepted
    assert not _git_processes(hole.port)


@pytest.mark.no_services
@pytest.mark.timeout(60)
def test_a_push_that_gets_no_answer_ends_at_the_time_limit(ssh_allowed, hole, tmp_path):
    ssh_allowed.GIT_NETWORK_TIMEOUT_SECONDS = 2
    origin = demo.sample_repository_create(tmp_path / "origin")
    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    commit = platform_git.commit_resolve(git_dir, "origin/main")
    started = time.monotonic()

    with pytest.raises(platform_git.PlatformGitError, match="timed out"):
        platform_git.commit_push(
            git_dir=git_dir,
            url=f"ssh://git@127.0.0.1:{hole.port}/octo/x.git",
            commit=commit,
            branch="agent/x",
        )

    assert time.monotonic() - started < 8
    assert hole.accepted and not _git_processes(hole.port)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_cancelling_a_run_stops_its_clone_and_frees_the_worker(
    workspace, repository, hole, start_worker
):
    start_worker(concurrency=1)
    stuck = RepositoryFactory(
        workspace=workspace,
        provider="github",
        external_id="octo/x",
        clone_url=f"https://127.0.0.1:{hole.port}/octo/x.git",
    )
    run = task_submit(
        workspace=workspace,
        repository=stuck,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    ).run
    wait_for(lambda: hole.accepted, timeout=30, message="the clone to connect")
    requested = time.monotonic()

    assert run_cancel_request(run=run, by="alice", reason="stuck clone") is True

    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED,
        timeout=30,
        message="the run to end cancelled",
    )
    assert time.monotonic() - requested < 15
    wait_for(lambda: not _git_processes(hole.port), timeout=5, message="git to be gone")
    # The only worker process takes the next run at once.
    after = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    ).run
    wait_for(
        lambda: Run.objects.get(pk=after.pk).status == Run.Status.COMPLETED,
        timeout=60,
        message="the next run to complete on the freed worker",
    )
