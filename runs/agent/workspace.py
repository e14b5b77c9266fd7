"""The run's working copy: created from the repository, restored after a crash or a move
to another worker from the base commit plus the checkpointed diff."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from runs.agent.sandbox import LocalSandbox, SandboxError, sandbox_for_run
from runs.models import Run

LOCAL_EXCLUDES = (
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".coverage",
    "node_modules/",
    ".tox/",
    ".venv/",
)


@dataclass
class Diff:
    text: str
    files: list[str]
    added: int
    removed: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _checked(sandbox: LocalSandbox, *args: str) -> str:
    result = sandbox.git(*args)
    if not result.ok:
        raise SandboxError(f"git {' '.join(args)} failed: {result.output.strip()[:500]}")
    return result.output


def workspace_clone(*, run: Run, ref: str) -> tuple[LocalSandbox, str]:
    """A fresh clone of the run's repository at ``ref``; returns it and the commit sha."""
    sandbox = sandbox_for_run(run.id)
    sandbox.create()
    repository = run.task.repository
    result = sandbox.run(
        ["git", "clone", "--quiet", "--no-hardlinks", repository.clone_url, "."], timeout=300
    )
    if not result.ok:
        sandbox.remove()
        raise SandboxError(f"clone of {repository.name} failed: {result.output.strip()[:500]}")
    _checked(sandbox, "checkout", "--quiet", "--detach", ref)
    sha = _checked(sandbox, "rev-parse", "HEAD").strip()
    # Caches that running tests leave behind are not part of the patch.
    exclude = sandbox.path / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(LOCAL_EXCLUDES) + "\n")
    return sandbox, sha


def _apply(sandbox: LocalSandbox, diff: str) -> None:
    patch_file = sandbox.root / f".{sandbox.path.name}.patch"
    patch_file.write_text(diff, encoding="utf-8")
    try:
        _checked(sandbox, "apply", "--binary", "--whitespace=nowarn", str(patch_file))
    finally:
        patch_file.unlink(missing_ok=True)


def workspace_ensure(*, run: Run, diff: str | None = None) -> LocalSandbox:
    """The run's working copy, rebuilt from the base commit and ``diff`` if it is missing."""
    sandbox = sandbox_for_run(run.id)
    if sandbox.exists() and (sandbox.path / ".git").exists():
        return sandbox
    sandbox, _ = workspace_clone(run=run, ref=run.base_commit)
    if diff:
        _apply(sandbox, diff)
    return sandbox


def workspace_restore(*, run: Run, diff: str | None) -> LocalSandbox:
    """The run's working copy exactly as checkpointed: base commit plus ``diff``.

    A step that re-executes after a crash finds whatever the dead attempt left half
    done; resetting to the checkpoint makes the replay start from the state its
    checkpointed conversation describes. Ignored files (installed dependencies, caches)
    are kept: they are not part of the patch.
    """
    sandbox = sandbox_for_run(run.id)
    if not (sandbox.exists() and (sandbox.path / ".git").exists()):
        return workspace_ensure(run=run, diff=diff)
    _checked(sandbox, "reset", "--quiet", "--hard", run.base_commit)
    _checked(sandbox, "clean", "--quiet", "-fd")
    if diff:
        _apply(sandbox, diff)
    return sandbox


def workspace_diff(sandbox: LocalSandbox, base_commit: str) -> Diff:
    """Everything changed since the base commit, new files included."""
    _checked(sandbox, "add", "--all")
    text = _checked(sandbox, "diff", "--cached", "--binary", base_commit)
    stat = _checked(sandbox, "diff", "--cached", "--numstat", base_commit)
    files: list[str] = []
    added = removed = 0
    for line in stat.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        files.append(parts[2])
        added += int(parts[0]) if parts[0].isdigit() else 0
        removed += int(parts[1]) if parts[1].isdigit() else 0
    return Diff(text=text, files=files, added=added, removed=removed)
