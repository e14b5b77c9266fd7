"""context_loading: the repository map and the opening messages."""

from __future__ import annotations

from runs.agent import safefs
from runs.agent.artifacts import artifact_create, redact
from runs.engine import Outcome, StepContext
from runs.steps.common import S, _sandbox

CONTEXT_CHAR_BUDGET = 24_000

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a git repository. Use the tools to "
    "read code, make the smallest change that does what is asked, run the tests, and call "
    "finish when the change is complete."
)


def repository_map(ctx: StepContext) -> str:
    """Files with their sizes and the first lines of each, within a character budget."""
    sandbox = _sandbox(ctx)
    # safefs: a committed link (e.g. to /proc/self/environ) is listed by no one and read
    # by no one; only regular files inside the working copy reach the model.
    files = list(safefs.walk(sandbox.path))
    lines = [f"{len(files)} files"]
    for entry in files:
        try:
            text = safefs.read_text(sandbox.path, entry.path, limit=256 * 1024)
        except (UnicodeDecodeError, OSError, safefs.UnsafePath):
            lines.append(f"- {entry.path} (binary)")
            continue
        head = " | ".join(s.strip() for s in text.splitlines()[:3] if s.strip())[:120]
        lines.append(f"- {entry.path} ({len(text.splitlines())} lines) {redact(head)}")
        if sum(len(line) for line in lines) > CONTEXT_CHAR_BUDGET:
            lines.append("- ... (truncated to the context budget)")
            break
    return "\n".join(lines)


def step_context_loading(ctx: StepContext) -> Outcome:
    repo_map = repository_map(ctx)
    context = artifact_create(run=ctx.run, kind="context", name="repository map", content=repo_map)
    user = f"Task: {ctx.task.instruction}\n\nRepository map:\n{repo_map}"
    if ctx.run.feedback:
        user += f"\n\nFeedback to address on the existing pull request:\n{ctx.run.feedback}"
    ctx.checkpoint["messages"] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]
    ctx.emit("agent.context.loaded", {"artifact_id": str(context.id), "chars": len(repo_map)})
    return Outcome(to=S.PLANNING)
