"""context_loading: the repository map and the opening messages."""

from __future__ import annotations

from runs.agent.artifacts import artifact_create, redact
from runs.agent.repomap import repo_map
from runs.agent.tools import Toolbox, ToolPolicy
from runs.protocol import Outcome, StepContext
from runs.steps.common import S, _sandbox, test_command_of

CONTEXT_CHAR_BUDGET = 24_000
SYSTEM_PROMPT_VERSION = "3"
# Kept for callers that want the one-line gist; the prompt a run uses is system_prompt().
SYSTEM_PROMPT = (
    "You are a careful software engineer working in a git repository. Use the tools to "
    "read code, make the smallest change that does what is asked, run the tests, and call "
    "finish when the change is complete."
)


def system_prompt(ctx: StepContext) -> str:
    """The rules of this run, stated: what to do, with what, within which limits."""
    repository = ctx.repository
    task = ctx.task
    budgets = ", ".join(
        f"{name} {task.budget_limit(name):g}"
        for name in ("model_turns", "model_errors", "tool_retries", "cost_usd", "agent_attempts")
    )
    forbidden = ", ".join(repository.forbidden_paths) or "none"
    allowed = ", ".join(repository.allowed_commands) or "none"
    test_command = test_command_of(ctx)
    return f"""You are a careful software engineer making one change in a git repository.
(system prompt v{SYSTEM_PROMPT_VERSION})

How to work:
- Act only through tool calls, one small step at a time. Start with repo_map or search to
  find the code, read_file to view it (windows of lines, with line numbers), then edit
  with replace_text (exact text, unique in the file) or insert; undo_edit reverts a
  file's last edit. Make the smallest change that does what is asked.
- Run the tests with run_tests (the repository's test command is `{test_command}`;
  pass a selection to run only some). Reproduce a failure before fixing it when you can.
- run_command runs a shell command line in the repository (or in cwd). Allowed commands:
  {allowed}. A non-zero exit code is information, not an error.
- Paths are relative to the repository root; /workspace/... names the same files.
- Never edit these paths (edits are refused): {forbidden}. The .git directory is off limits.
- Long outputs are clipped with a marker saying what was left out; ask for a narrower
  window or search instead of re-reading whole files. Older outputs may be condensed.
- When the change is complete and the tests pass, call finish with a summary: its first
  line becomes the commit's subject. Repeating the same call for the same answer gets
  a warning, then the loop is stopped and your changes are submitted as they are.

Limits for this task (all runs together): {budgets}. A malformed tool call, a reply
without a tool call, or a reply cut off at the output limit counts as a model error.

After you finish, the platform runs `{test_command}` on your patch, and a
reviewer checks that the change does what was asked, touches no forbidden path, modifies
no tests unless asked, and stays small. Failing either sends you back with feedback."""


def repository_map(ctx: StepContext) -> str:
    """The ranked map of symbols (tree-sitter) and the other files, within a budget."""
    sandbox = _sandbox(ctx)
    toolbox = Toolbox(sandbox, ToolPolicy())
    # safefs underneath: a committed link (e.g. to /proc/self/environ) is read by no one.
    return redact(
        repo_map(
            sandbox.path,
            toolbox._files(),
            focus=ctx.task.instruction,
            budget=CONTEXT_CHAR_BUDGET // 2,
        )
    )


def step_context_loading(ctx: StepContext) -> Outcome:
    repo_map = repository_map(ctx)
    context = artifact_create(run=ctx.run, kind="context", name="repository map", content=repo_map)
    user = f"Task: {ctx.task.instruction}\n\nRepository map:\n{repo_map}"
    if ctx.run.feedback:
        user += f"\n\nFeedback to address on the existing pull request:\n{ctx.run.feedback}"
    prompt = system_prompt(ctx)
    artifact_create(
        run=ctx.run, kind="context", name=f"system prompt v{SYSTEM_PROMPT_VERSION}", content=prompt
    )
    ctx.checkpoint["system_prompt_version"] = SYSTEM_PROMPT_VERSION
    ctx.checkpoint["messages"] = [
        {"role": "system", "content": prompt},
        {"role": "user", "content": user},
    ]
    ctx.emit("agent.context.loaded", {"artifact_id": str(context.id), "chars": len(repo_map)})
    return Outcome(to=S.PLANNING)
