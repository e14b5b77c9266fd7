"""A repository's setup runs in the sandbox before the agent (no network unless its
policy allows, and then only there), is cached per lock-file hash, is read-only to runs,
and the tests run with the environment it made."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from runs import demo
from runs.agent import platform_git
from runs.agent.sandbox import LocalSandbox
from runs.agent.setup import SetupFailed, setup_ensure
from runs.engine import run_drive_inline
from runs.models import Run, ToolCall
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

# Makes the repository's own environment with a module only it has.
PURELIB = ".venv/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'"
SETUP = f"python3 -m venv --without-pip .venv && echo 'MARK = 42' > $({PURELIB})/repo_env_marker.py"


def _submit(workspace, repository, script=None):
    return task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        execution_mode="autonomous_pr",
        model_options={"provider": "scripted", "script": script or demo.fix_script()},
    )


def _setup_event(run: Run) -> dict:
    return run.events.get(type="agent.setup.completed").data


def test_tests_run_in_the_repository_environment_and_the_cache_is_reused(
    workspace, repository, sample_repo
):
    repository.setup_command = SETUP
    repository.test_command = (
        ".venv/bin/python -c 'import repo_env_marker' && "
        ".venv/bin/python -m unittest discover -s tests -q"
    )
    repository.save()

    first = run_drive_inline(run_id=_submit(workspace, repository).run.id)
    second = run_drive_inline(run_id=_submit(workspace, repository).run.id)

    for run in (first, second):
        assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
        assert run.verifications.get().outcome == "passed"
    assert _setup_event(first)["cached"] is False and _setup_event(second)["cached"] is True
    assert _setup_event(first)["cache_key"] == _setup_event(second)["cache_key"]

    # A changed lock file is a new environment.
    work = sample_repo.parent / "lockchange"
    subprocess.run(["git", "clone", "-q", str(sample_repo), str(work)], check=True)
    (work / "requirements.txt").write_text("# nothing yet\n")
    for args in (["add", "-A"], ["commit", "-qm", "lock"], ["push", "-q", "origin", "HEAD:main"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=work, check=True
        )
    third = run_drive_inline(run_id=_submit(workspace, repository).run.id)
    assert _setup_event(third)["cached"] is False
    assert _setup_event(third)["cache_key"] != _setup_event(first)["cache_key"]


def test_the_cached_setup_is_read_only_to_runs(workspace, repository, settings):
    repository.setup_command = SETUP
    repository.allowed_commands = [*repository.allowed_commands, "touch", "rm"]
    repository.save()
    script = demo.fix_script()
    script["turns"].insert(
        0,
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": "touch .venv/planted"}},
                {"name": "run_command", "arguments": {"command": "rm -rf .venv/bin"}},
            ]
        },
    )

    run = run_drive_inline(run_id=_submit(workspace, repository, script).run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    outputs = [
        c.result.get("output", "") for c in ToolCall.objects.filter(run=run, tool="run_command")
    ]
    assert sum("Read-only file system" in o for o in outputs) >= 2
    caches = list(Path(settings.SETUP_CACHE_ROOT).glob(f"repository-{repository.pk}/*/.venv"))
    assert caches and all((c / "bin").is_dir() and not (c / "planted").exists() for c in caches)


@pytest.mark.parametrize("allowed", [False, True])
def test_setup_network_is_off_unless_the_policy_allows_it(
    workspace, repository, sample_repo, settings, tmp_path, allowed
):
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    git_dir = platform_git.repository_fetch(url=str(sample_repo), dest=tmp_path / "p.git")
    base = platform_git.commit_resolve(git_dir, "origin/main")
    box = LocalSandbox("run-net-1")
    box.git_dir = git_dir
    box.create()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    repository.setup_command = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\""
        " && mkdir .venv"
    )
    repository.setup_network = allowed
    repository.save()
    try:
        if allowed:
            assert setup_ensure(repository=repository, sandbox=box, base_commit=base)
            assert box.readonly_mounts
        else:
            with pytest.raises(SetupFailed, match=r"ConnectionRefused|Network is unreachable"):
                setup_ensure(repository=repository, sandbox=box, base_commit=base)
    finally:
        listener.close()
    # The agent's own commands never have a network, whatever the setup policy.
    probe = box.run(
        ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"]
    )
    assert probe.exit_code != 0


def test_the_agents_edits_never_reach_the_cached_environment(workspace, repository, settings):
    repository.setup_command = SETUP
    repository.save()
    script = demo.fix_script()
    # The agent edits a lock file and the setup's inputs; the cache is still made from
    # the base commit only, once.
    script["turns"].insert(
        0,
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "requirements.txt", "content": "evil==1.0\n"},
                }
            ]
        },
    )

    run = run_drive_inline(run_id=_submit(workspace, repository, script).run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    root = Path(settings.SETUP_CACHE_ROOT) / f"repository-{repository.pk}"
    keys = [p.name for p in root.iterdir() if not p.name.startswith(".")]
    assert keys == [_setup_event(run)["cache_key"]]
    assert run.checkpoint["setup_key"] == keys[0]
