"""The platform's own git: never trusts the working copy's ``.git``.

Everything the platform does with git (clone, restore a working copy, compute the diff,
build the commit, push) runs outside the sandbox against a repository the platform
owns (``PLATFORM_GIT_ROOT/run-<id>.git``), never mounted into a sandbox. The working
copy's ``.git`` is the agent's to use and to wreck: its config, hooks, filters,
aliases, ``insteadOf`` rewrites and attributes are never read by these commands.

Every git process gets a clean configuration: no system or global config, no HOME,
hooks off, fsmonitor off, no line-ending conversion, and an ``info/attributes`` in the
platform repository that overrides any ``.gitattributes`` in the tree so no filter,
``ident`` or encoding conversion applies: the commit holds the working copy's bytes.
Credentials travel as config in the environment of the one git process that needs them
(``GIT_CONFIG_COUNT``), never in a command line, a remote URL or a file.

Every git process runs in a process group of its own and is killed with its whole group
(remote helpers, ssh) when its time is up or its run is cancelled. A clone or push
allows exactly its URL's protocol, follows no redirect, and reaches only the address
``runs.git_network`` checked right before it started.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from runs.agent.sandbox import (
    CommandCancelled,
    SandboxError,
)
from runs.git_network import AddressRefused, connection_for

# Overrides every .gitattributes of the tree (info/attributes has the highest
# precedence): no filter, ident, eol or encoding conversion, no custom diff or merge.
NEUTRAL_ATTRIBUTES = "* -text !eol -ident -filter !working-tree-encoding !diff !merge\n"
# Caches that running tests leave behind are not part of the patch.
LOCAL_EXCLUDES = (
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".coverage",
    "node_modules/",
    ".tox/",
    "/.venv/",
)
IDENTITY = {
    "GIT_AUTHOR_NAME": "agentplatform",
    "GIT_AUTHOR_EMAIL": "agent@agentplatform.invalid",
    "GIT_COMMITTER_NAME": "agentplatform",
    "GIT_COMMITTER_EMAIL": "agent@agentplatform.invalid",
}
CLEAN_CONFIG = {
    "core.hooksPath": os.devnull,
    "core.fsmonitor": "false",
    "core.autocrlf": "false",
    "core.symlinks": "true",
    "core.quotePath": "false",
    "diff.renames": "false",
    "safe.directory": "*",
    # Which transports a process may use is GIT_ALLOW_PROTOCOL's (one per process); ext::
    # runs a command and is never one of them.
    "protocol.allow": "never",
    "protocol.ext.allow": "never",
    # A redirect would carry the request (and its headers) to a host nobody checked.
    "http.followRedirects": "false",
}
# How often a running git process is checked for its deadline and for cancellation.
POLL_SECONDS = 0.2


class PlatformGitError(SandboxError):
    """A git command of the platform failed."""


class GitRemoteRefused(PlatformGitError):
    """The remote may not be reached (its address, its scheme); retrying will not help."""


class GitStopped(PlatformGitError, CommandCancelled):
    """A git command was stopped because its run was cancelled (or lost its lease)."""


class PatchMismatch(SandboxError):
    """What would be pushed differs from the patch that was verified and approved."""


@dataclass
class Diff:
    text: str
    files: list[str]
    added: int
    removed: int

    @property
    def sha256(self) -> str:
        return diff_sha256(self.text)


def diff_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def git_environment(config: dict[str, str] | None = None) -> dict[str, str]:
    """A git environment with no configuration but ours (and ``config``)."""
    settings_config = {**CLEAN_CONFIG, **(config or {})}
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "HOME": os.devnull,
        "XDG_CONFIG_HOME": os.devnull,
        "GIT_CONFIG_COUNT": str(len(settings_config)),
        **IDENTITY,
    }
    for index, (key, value) in enumerate(settings_config.items()):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def git_run(
    *args: str,
    git_dir: Path | None = None,
    work_tree: Path | None = None,
    index: Path | None = None,
    stdin: bytes | None = None,
    config: dict[str, str] | None = None,
    timeout: float = 300,
    protocol: str = "file",
    env: dict[str, str] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run one platform git command with the clean environment; any exit code.

    ``protocol`` is the one transport it may use; the process and everything it starts
    are killed after ``timeout`` seconds (PlatformGitError) or as soon as
    ``should_stop()`` says so (GitStopped)."""
    full_env = {**git_environment(config), **(env or {}), "GIT_ALLOW_PROTOCOL": protocol}
    if git_dir is not None:
        full_env["GIT_DIR"] = str(git_dir)
    if work_tree is not None:
        full_env["GIT_WORK_TREE"] = str(work_tree)
    if index is not None:
        full_env["GIT_INDEX_FILE"] = str(index)
    process = subprocess.Popen(
        ["git", *args],
        env=full_env,
        cwd=str(work_tree or git_dir or "/"),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with process:
        try:
            stdout, stderr = _communicate(process, stdin, timeout, should_stop)
        except BaseException:
            # A deadline, a cancellation, or a Celery time limit raised into the wait:
            # nothing git started may outlive the call.
            _group_kill(process)
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _communicate(
    process: subprocess.Popen[bytes],
    stdin: bytes | None,
    timeout: float,
    should_stop: Callable[[], bool] | None,
) -> tuple[bytes, bytes]:
    deadline = time.monotonic() + timeout
    command = process.args[1] if isinstance(process.args, list) else "git"
    pending = stdin
    while True:
        try:
            # Returns as soon as git ends; output is kept across the retries.
            return process.communicate(pending, timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            pending = None
        if time.monotonic() >= deadline:
            raise PlatformGitError(f"git {command} timed out after {timeout:g}s")
        if should_stop is not None and should_stop():
            raise GitStopped(f"git {command} stopped: run cancelled")


def _group_kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        # Something escaped the group and holds the pipes: stop reading them.
        process.kill()


def git(
    *args: str,
    git_dir: Path | None = None,
    work_tree: Path | None = None,
    index: Path | None = None,
    stdin: bytes | None = None,
    config: dict[str, str] | None = None,
    timeout: float = 300,
    secret: str = "",
    protocol: str = "file",
    env: dict[str, str] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """Run one platform git command; its stdout, or PlatformGitError (secret redacted)."""
    completed = git_run(
        *args,
        git_dir=git_dir,
        work_tree=work_tree,
        index=index,
        stdin=stdin,
        config=config,
        timeout=timeout,
        protocol=protocol,
        env=env,
        should_stop=should_stop,
    )
    if completed.returncode != 0:
        message = completed.stderr.decode("utf-8", "replace").strip()
        if secret:
            message = message.replace(secret, "[REDACTED]")
        raise PlatformGitError(f"git {args[0]} failed: {message[:500]}")
    return completed.stdout.decode("utf-8", "replace")


def git_remote(
    *args: str,
    url: str,
    git_dir: Path | None = None,
    config: dict[str, str] | None = None,
    secret: str = "",
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """A git command that talks to ``url``: its address checked now and pinned, only its
    protocol allowed, the network time limit applied."""
    try:
        connection = connection_for(url)
    except AddressRefused as exc:
        raise GitRemoteRefused(f"git {args[0]} refused: {exc}") from exc
    env = dict(connection.env)
    if connection.protocol == "ssh" and os.environ.get("SSH_AUTH_SOCK"):
        env["SSH_AUTH_SOCK"] = os.environ["SSH_AUTH_SOCK"]
    return git(
        *args,
        git_dir=git_dir,
        config={**(config or {}), **connection.config},
        timeout=settings.GIT_NETWORK_TIMEOUT_SECONDS,
        secret=secret,
        protocol=connection.protocol,
        env=env,
        should_stop=should_stop,
    )


def _harden(git_dir: Path) -> None:
    info = git_dir / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "attributes").write_text(NEUTRAL_ATTRIBUTES)
    (info / "exclude").write_text("\n".join(LOCAL_EXCLUDES) + "\n")
    shutil.rmtree(git_dir / "hooks", ignore_errors=True)


def repository_fetch(
    *,
    url: str,
    dest: Path,
    config: dict[str, str] | None = None,
    secret: str = "",
    should_stop: Callable[[], bool] | None = None,
) -> Path:
    """A bare copy of the repository at ``url`` owned by the platform (made once)."""
    if (dest / "HEAD").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    try:
        git_remote(
            "clone",
            "--bare",
            "--quiet",
            "--no-hardlinks",
            "--",
            url,
            str(scratch),
            url=url,
            config=config,
            secret=secret,
            should_stop=should_stop,
        )
        _harden(scratch)
        # Another process may have finished the same clone meanwhile; theirs is as good.
        try:
            scratch.rename(dest)
        except OSError:
            if not (dest / "HEAD").exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def commit_resolve(git_dir: Path, ref: str) -> str:
    """The commit ``ref`` names (``origin/<branch>`` means the branch of the origin)."""
    candidates = [ref]
    if ref.startswith("origin/"):
        candidates.insert(0, f"refs/heads/{ref.removeprefix('origin/')}")
    for candidate in candidates:
        try:
            return git(
                "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}", git_dir=git_dir
            ).strip()
        except PlatformGitError:
            continue
    raise PlatformGitError(f"no commit {ref!r} in the repository")


def worktree_create(*, git_dir: Path, workdir: Path, commit: str, diff: str = "") -> None:
    """Fill the empty ``workdir`` with ``commit`` plus ``diff``, and give it a fresh
    ``.git`` of its own for the agent's use (the platform never reads it)."""
    git("clone", "--quiet", "--no-hardlinks", "--no-checkout", str(git_dir), str(workdir))
    agent_git = workdir / ".git"
    _harden(agent_git)
    git("checkout", "--quiet", "--detach", commit, git_dir=agent_git, work_tree=workdir)
    if diff:
        patch_apply(git_dir=git_dir, workdir=workdir, diff=diff)


def patch_apply(*, git_dir: Path, workdir: Path, diff: str) -> None:
    """Apply ``diff`` to the files of ``workdir`` (git refuses paths beyond a link)."""
    git(
        "apply",
        "--binary",
        "--whitespace=nowarn",
        "-",
        git_dir=git_dir,
        work_tree=workdir,
        stdin=diff.encode("utf-8"),
    )


def _numstat(git_dir: Path, base: str, tree: str) -> tuple[list[str], int, int]:
    stat = git("diff", "--numstat", "--no-renames", base, tree, git_dir=git_dir)
    files: list[str] = []
    added = removed = 0
    for line in stat.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        files.append(parts[2])
        added += int(parts[0]) if parts[0].isdigit() else 0
        removed += int(parts[1]) if parts[1].isdigit() else 0
    return files, added, removed


def _diff_text(git_dir: Path, base: str, tree: str) -> str:
    return git(
        "diff",
        "--binary",
        "--full-index",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        base,
        tree,
        git_dir=git_dir,
    )


def tree_build(*, git_dir: Path, workdir: Path, base: str) -> tuple[str, Diff]:
    """The tree of the working copy's files (new ones included, ignored ones not) and
    its diff against ``base``, built in the platform repository from file contents."""
    with tempfile.TemporaryDirectory(prefix="index-", dir=git_dir) as scratch:
        index = Path(scratch) / "index"
        git("read-tree", base, git_dir=git_dir, index=index)
        git("add", "--all", git_dir=git_dir, work_tree=workdir, index=index)
        tree = git("write-tree", git_dir=git_dir, index=index).strip()
    files, added, removed = _numstat(git_dir, base, tree)
    text = _diff_text(git_dir, base, tree) if files else ""
    return tree, Diff(text=text, files=files, added=added, removed=removed)


def patch_tree(*, git_dir: Path, base: str, diff: str) -> str:
    """The tree of ``base`` plus ``diff``, built in the platform repository."""
    with tempfile.TemporaryDirectory(prefix="index-", dir=git_dir) as scratch:
        index = Path(scratch) / "index"
        git("read-tree", base, git_dir=git_dir, index=index)
        if diff:
            git(
                "apply",
                "--cached",
                "--binary",
                "--whitespace=nowarn",
                "-",
                git_dir=git_dir,
                index=index,
                stdin=diff.encode("utf-8"),
            )
        return git("write-tree", git_dir=git_dir, index=index).strip()


def tree_paths(git_dir: Path, treeish: str) -> set[str]:
    """Every file path in ``treeish`` (links included, directories not)."""
    listing = git("ls-tree", "-r", "-z", "--name-only", treeish, git_dir=git_dir)
    return {path for path in listing.split("\0") if path}


def tree_file(git_dir: Path, treeish: str, path: str) -> str | None:
    """The text of ``path`` in ``treeish`` (None when it is not there)."""
    completed = git_run("cat-file", "blob", f"{treeish}:{path}", git_dir=git_dir)
    if completed.returncode != 0:
        return None
    return completed.stdout.decode("utf-8", "replace")


def tree_diff(git_dir: Path, base: str, tree: str, *, leave_out: list[str]) -> str:
    """The diff from ``base`` to ``tree`` without the files ``leave_out`` names: those
    stay as ``base`` has them when the diff is applied."""
    pathspecs = [f":(exclude,literal){path}" for path in leave_out]
    return git(
        "diff",
        "--binary",
        "--full-index",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        base,
        tree,
        "--",
        *pathspecs,
        git_dir=git_dir,
    )


def patch_commit(*, git_dir: Path, base: str, diff: str, message: str) -> tuple[str, Diff]:
    """A commit of ``base`` plus ``diff`` and the diff of that commit, made again from the
    commit itself: the caller compares its hash with the verified patch's."""
    tree = patch_tree(git_dir=git_dir, base=base, diff=diff)
    commit = git("commit-tree", tree, "-p", base, "-m", message, git_dir=git_dir).strip()
    files, added, removed = _numstat(git_dir, base, commit)
    text = _diff_text(git_dir, base, commit) if files else ""
    return commit, Diff(text=text, files=files, added=added, removed=removed)


def commit_push(
    *,
    git_dir: Path,
    url: str,
    commit: str,
    branch: str,
    config: dict[str, str] | None = None,
    secret: str = "",
    should_stop: Callable[[], bool] | None = None,
) -> None:
    """Force ``commit`` onto ``branch`` at ``url`` (the branch belongs to the task)."""
    git_remote(
        "push",
        "--quiet",
        "--force",
        "--",
        url,
        f"{commit}:refs/heads/{branch}",
        url=url,
        git_dir=git_dir,
        config=config,
        secret=secret,
        should_stop=should_stop,
    )
