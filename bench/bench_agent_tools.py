"""The agent's search and repository map on this project's own clone, against a baseline.

The clone gets an ignored ``.venv`` of 3,000 small Python files, as a developer's checkout
has. The baseline is the walk every file and match a regex approach (what a naive
search tool does, and what this project's search did); ``search`` is the tool as the
model calls it (git grep in the sandbox, .gitignore respected); ``repo_map`` is the
tree-sitter ranked map. Prints milliseconds per call and the ratio to the baseline.

    .venv/bin/python bench/bench_agent_tools.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from runs.agent.sandbox import LocalSandbox  # noqa: E402
from runs.agent.tools import Toolbox, ToolPolicy  # noqa: E402

REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))
PATTERN = r"def step_running\("


def _clone(root: Path) -> LocalSandbox:
    settings.SANDBOX_ROOT = str(root)
    sandbox = LocalSandbox("bench-clone")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(sandbox.path)], check=True)
    venv = sandbox.path / ".venv" / "lib"
    venv.mkdir(parents=True)
    for n in range(3000):
        (venv / f"mod{n}.py").write_text("def step_running():\n    pass\n" * 20)
    return sandbox


def _walk_search(root: Path) -> int:
    regex = re.compile(PATTERN)
    hits = 0
    for path in root.rglob("*"):
        if not path.is_file() or ".git" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hits += sum(1 for line in text.splitlines() if regex.search(line))
    return hits


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm caches
    started = time.perf_counter()
    for _ in range(REPEAT):
        fn()
    return (time.perf_counter() - started) / REPEAT * 1000


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        sandbox = _clone(Path(scratch))
        toolbox = Toolbox(sandbox, ToolPolicy(), focus="step_running")
        baseline = _timed(lambda: _walk_search(sandbox.path))
        search = _timed(lambda: toolbox.execute("search", {"pattern": PATTERN}))
        repo_map = _timed(lambda: toolbox.execute("repo_map", {}))
    print(f"baseline walk-and-regex search: {baseline:8.1f} ms")
    print(f"search tool (git grep):         {search:8.1f} ms   ratio {search / baseline:.3f}")
    print(f"repo_map tool (tree-sitter):    {repo_map:8.1f} ms   ratio {repo_map / baseline:.3f}")


if __name__ == "__main__":
    main()
