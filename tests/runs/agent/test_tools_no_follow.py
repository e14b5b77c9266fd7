"""File tools never follow a link out of the working copy (a committed symlink to
/proc/self/environ, a link to another run's working copy, a hard link, a FIFO)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from runs.agent import platform_git, safefs
from runs.agent.sandbox import LocalSandbox
from runs.agent.tools import Toolbox, ToolDenied, ToolPolicy

pytestmark = pytest.mark.no_services

SECRET = "ghp_" + "S3cr3tT0k3n" * 4


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def hostile_checkout(tmp_path, settings, monkeypatch):
    """A clone of a repository that commits links pointing out of the working copy."""
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    other = LocalSandbox("run-other")
    other.create()
    (other.path / "private.txt").write_text("other tenant's code\n")

    origin = tmp_path / "origin"
    (origin / "pkg").mkdir(parents=True)
    (origin / "pkg" / "code.py").write_text("def add(a, b):\n    return a + b\n")
    (origin / "pkg" / "env_link").symlink_to("/proc/self/environ")
    (origin / "neighbour").symlink_to(other.path)
    (origin / "up").symlink_to("..")
    _git(origin, "init", "-q", "-b", "main")
    _git(origin, "add", "-A")
    _git(origin, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "hostile")

    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    box = LocalSandbox("run-hostile")
    box.create()
    box.git_dir = git_dir
    base = platform_git.commit_resolve(git_dir, "origin/main")
    platform_git.worktree_create(git_dir=git_dir, workdir=box.path, commit=base)
    assert (box.path / "pkg" / "env_link").is_symlink()
    return box, other


def _toolbox(box: LocalSandbox) -> Toolbox:
    return Toolbox(box, ToolPolicy(forbidden_paths=["secrets/**"], allowed_commands=[]))


def _call(toolbox: Toolbox, name: str, **arguments):
    toolbox.check(name, arguments)
    return toolbox.execute(name, arguments)


def test_search_does_not_follow_a_link_to_proc_environ(hostile_checkout):
    box, _ = hostile_checkout
    toolbox = _toolbox(box)

    for pattern in ("GITHUB_TOKEN", "ghp_", "S3cr3t", "PATH="):
        result = _call(toolbox, "search", pattern=pattern)
        assert result.status == "completed"
        assert SECRET not in result.output and "env_link" not in result.output

    scoped = _call(toolbox, "search", pattern=".", path="pkg/env_link")
    assert "S3cr3t" not in scoped.output and "PATH=" not in scoped.output
    assert _call(toolbox, "search", pattern="return", path="pkg").output.startswith("pkg/code.py")


def test_read_file_refuses_links(hostile_checkout):
    box, _ = hostile_checkout
    toolbox = _toolbox(box)

    for path in ("pkg/env_link", "neighbour/private.txt", "up/run-other/private.txt"):
        result = _call(toolbox, "read_file", path=path)
        assert result.status == "denied", path
        assert "S3cr3t" not in result.output and "tenant" not in result.output
    assert "return a + b" in _call(toolbox, "read_file", path="./pkg//code.py").output


def test_list_files_does_not_descend_into_a_link(hostile_checkout):
    box, _ = hostile_checkout
    toolbox = _toolbox(box)

    listed = _call(toolbox, "list_files").output.splitlines()

    # A link may be named, but nothing behind it is listed.
    assert "pkg/code.py" in listed
    assert not [p for p in listed if p.startswith(("neighbour/", "up/"))]
    assert "private.txt" not in _call(toolbox, "list_files", path="neighbour").output


def test_writes_never_go_through_a_link(hostile_checkout):
    box, other = hostile_checkout
    toolbox = _toolbox(box)

    onto = _call(toolbox, "write_file", path="neighbour", content="mine\n")
    through = _call(toolbox, "write_file", path="neighbour/private.txt", content="pwned\n")
    replaced = _call(toolbox, "replace_text", path="up/run-other/private.txt", old="o", new="0")

    assert {onto.status, through.status, replaced.status} == {"denied"}
    assert (box.path / "neighbour").is_symlink()
    assert (other.path / "private.txt").read_text() == "other tenant's code\n"


def test_safefs_write_replaces_a_link_instead_of_writing_through_it(hostile_checkout):
    box, other = hostile_checkout

    safefs.write_text(box.path, "neighbour", "mine\n")

    assert not (box.path / "neighbour").is_symlink()
    assert (box.path / "neighbour").read_text() == "mine\n"
    assert (other.path / "private.txt").read_text() == "other tenant's code\n"


def test_hard_links_and_fifos_are_refused(hostile_checkout, tmp_path):
    box, _ = hostile_checkout
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    os.link(outside, box.path / "hard")
    os.mkfifo(box.path / "fifo")
    toolbox = _toolbox(box)

    assert _call(toolbox, "read_file", path="hard").status == "denied"
    assert _call(toolbox, "replace_text", path="hard", old="out", new="in").status == "denied"
    assert _call(toolbox, "read_file", path="fifo").status == "denied"  # and did not hang
    assert outside.read_text() == "outside\n"


@pytest.mark.parametrize(
    "path",
    [
        "../run-other/private.txt",
        "/etc/passwd",
        "pkg/../../x",
        ".git/config",
        "a/.git/x",
        "a/../.git/hooks/x",
    ],
)
def test_paths_that_leave_the_working_copy_are_denied_before_running(hostile_checkout, path):
    box, _ = hostile_checkout
    with pytest.raises(ToolDenied):
        _toolbox(box).check("read_file", {"path": path})


def test_forbidden_paths_hold_for_every_spelling(hostile_checkout):
    box, _ = hostile_checkout
    for path in ("secrets/key", "./secrets/key", "secrets//key"):
        with pytest.raises(ToolDenied):
            _toolbox(box).check("write_file", {"path": path, "content": "x"})


def test_safefs_write_keeps_the_mode_and_creates_parents(tmp_path):
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)

    safefs.write_text(tmp_path, "run.sh", "#!/bin/sh\necho hi\n")
    safefs.write_text(tmp_path, "new/dir/file.txt", "x")

    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "new" / "dir" / "file.txt").read_text() == "x"
    assert not [p for p in tmp_path.rglob("*.tmp")]
