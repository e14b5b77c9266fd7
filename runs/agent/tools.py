"""The tools a model may call, confined to the run's sandbox and the repository's policy."""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from runs.agent import safefs
from runs.agent.artifacts import redact
from runs.agent.sandbox import Sandbox

MAX_READ_BYTES = 64 * 1024
MAX_SEARCH_HITS = 200


@dataclass
class ToolPolicy:
    forbidden_paths: list[str] = field(default_factory=list)
    allowed_commands: list[str] = field(default_factory=list)
    command_timeout: float = 300


@dataclass
class ToolResult:
    status: str  # completed | failed | denied | timed_out
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    @property
    def denied(self) -> bool:
        return self.status == "denied"


class ToolDenied(Exception):
    """The call breaks the repository's policy; it is refused, not retried."""


def path_normalize(path: str) -> str:
    """A repository-relative path without ``./``, duplicate slashes or ``..`` detours."""
    normalized = posixpath.normpath(path.strip().replace("\\", "/"))
    return "" if normalized == "." else normalized.lstrip("/")


def path_is_forbidden(path: str, patterns: list[str]) -> str | None:
    """The first forbidden pattern that matches ``path`` (or one of its parents)."""
    normalized = path_normalize(path)
    name = normalized.rsplit("/", 1)[-1]
    for pattern in patterns:
        if pattern.endswith("/**"):
            prefix = pattern[:-3]
            if normalized == prefix or normalized.startswith(prefix + "/"):
                return pattern
        if fnmatch.fnmatchcase(normalized, pattern) or fnmatch.fnmatchcase(name, pattern):
            return pattern
    return None


TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List files of the repository under a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "default": "."}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file, optionally a range of 1-based lines.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start_line": {"type": "integer"},
                    "end_line": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the repository for a regular expression.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "replace_text",
            "description": "Replace an exact text (must occur once unless count is given).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old": {"type": "string"},
                    "new": {"type": "string"},
                    "count": {"type": "integer"},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a command allowed by the repository's policy.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Stop editing; the patch is ready for verification.",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string"}},
            },
        },
    },
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOL_SCHEMAS)


def _schema_of(name: str, tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    for tool in tools:
        if tool["function"]["name"] == name:
            return tool["function"]
    return None


def tool_call_problem(
    name: str, arguments: dict[str, Any], error: str, tools: list[dict[str, Any]]
) -> str:
    """Why a call cannot run as the model wrote it, with the schema it should follow.

    The answer goes back to the model as the call's result, so it names the problem
    and shows the valid schema (or the tools that exist) rather than a Python error.
    """
    schema = _schema_of(name, tools)
    if schema is None:
        names = ", ".join(t["function"]["name"] for t in tools)
        return f"unknown tool {name!r}. The tools that exist are: {names}."
    shown = json.dumps(schema["parameters"], sort_keys=True)
    if error:
        return f"{error}. Call {name} again with arguments matching this schema: {shown}"
    parameters = {**schema["parameters"], "additionalProperties": False}
    problems = sorted(
        (e.message for e in Draft202012Validator(parameters).iter_errors(arguments)), key=str
    )
    if problems:
        return f"invalid arguments for {name}: {'; '.join(problems)}. The valid schema is: {shown}"
    return ""


class Toolbox:
    """Executes tool calls against one sandbox under one policy."""

    def __init__(
        self,
        sandbox: Sandbox,
        policy: ToolPolicy,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.should_stop = should_stop

    def check(self, name: str, arguments: dict[str, Any]) -> None:
        """Raise ToolDenied if the call breaks policy; called before the call starts."""
        if name not in TOOL_NAMES:
            raise ToolDenied(f"unknown tool {name!r}")
        if name in {"replace_text", "write_file", "read_file", "list_files", "search"}:
            path = str(arguments.get("path", "."))
            try:
                relative = safefs.clean(path)
            except safefs.UnsafePath as exc:
                raise ToolDenied(str(exc)) from exc
            # Links are never followed (safefs), so the cleaned path is the only name
            # the call can reach: a "./" prefix or a symlink cannot sneak past the policy.
            if ".git" in relative.split("/"):
                raise ToolDenied("the repository's .git directory is off limits")
            if name in {"replace_text", "write_file"}:
                pattern = path_is_forbidden(relative, self.policy.forbidden_paths)
                if pattern:
                    raise ToolDenied(f"path {path!r} is forbidden by policy ({pattern})")
        if name == "run_command":
            command = str(arguments.get("command", ""))
            try:
                argv = shlex.split(command)
            except ValueError as exc:
                raise ToolDenied(f"command does not parse: {exc}") from exc
            if not argv:
                raise ToolDenied("empty command")
            if argv[0] not in self.policy.allowed_commands:
                raise ToolDenied(f"command {argv[0]!r} is not in the allowed commands")
            if any(token in command for token in (";", "&&", "||", "|", "`", "$(", ">")):
                raise ToolDenied("shell operators are not allowed in commands")

    def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run the tool; its output is redacted of known secret patterns.

        Redaction is the second line of defence: the walls (safefs, the sandbox) keep
        secrets out of reach; this catches what a repository itself holds.
        """
        handler = getattr(self, f"_tool_{name}")
        try:
            result: ToolResult = handler(**arguments)
        except TypeError as exc:
            result = ToolResult("failed", f"bad arguments for {name}: {exc}")
        except safefs.UnsafePath as exc:
            result = ToolResult("denied", f"refused: {exc}")
        except (OSError, UnicodeDecodeError, re.error) as exc:
            result = ToolResult("failed", f"{type(exc).__name__}: {exc}")
        result.output = redact(result.output)
        return result

    # --- the tools --------------------------------------------------------------------
    # Every file access goes through safefs: no link is followed, nothing outside the
    # working copy is reachable, whatever the repository or a command planted.

    def _tool_list_files(self, path: str = ".") -> ToolResult:
        files = [entry.path for entry in safefs.walk(self.sandbox.path, path)]
        return ToolResult("completed", "\n".join(files[:2000]), {"count": len(files)})

    def _tool_read_file(
        self, path: str, start_line: int | None = None, end_line: int | None = None
    ) -> ToolResult:
        raw = safefs.read_bytes(self.sandbox.path, path, limit=MAX_READ_BYTES)
        text = raw.decode("utf-8", errors="replace")
        lines = text.splitlines()
        first = max(1, start_line or 1)
        last = min(len(lines), end_line or len(lines))
        numbered = "\n".join(f"{n}: {lines[n - 1]}" for n in range(first, last + 1))
        return ToolResult("completed", numbered, {"lines": len(lines)})

    def _tool_search(self, pattern: str, path: str = ".") -> ToolResult:
        regex = re.compile(pattern)
        hits: list[str] = []
        for entry in safefs.walk(self.sandbox.path, path):
            if len(hits) >= MAX_SEARCH_HITS:
                break
            try:
                content = safefs.read_text(self.sandbox.path, entry.path)
            except (UnicodeDecodeError, OSError, safefs.UnsafePath):
                continue
            for number, line in enumerate(content.splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{entry.path}:{number}: {line}")
                    if len(hits) >= MAX_SEARCH_HITS:
                        break
        return ToolResult("completed", "\n".join(hits), {"hits": len(hits)})

    def _tool_replace_text(self, path: str, old: str, new: str, count: int = 0) -> ToolResult:
        content = safefs.read_text(self.sandbox.path, path)
        found = content.count(old)
        if found == 0:
            return ToolResult("failed", f"text not found in {path}")
        if count == 0 and found > 1:
            return ToolResult("failed", f"text occurs {found} times in {path}; pass count")
        safefs.write_text(self.sandbox.path, path, content.replace(old, new, count or 1))
        return ToolResult("completed", f"replaced {count or 1} occurrence(s) in {path}")

    def _tool_write_file(self, path: str, content: str) -> ToolResult:
        safefs.write_text(self.sandbox.path, path, content)
        return ToolResult("completed", f"wrote {len(content)} characters to {path}")

    def _tool_run_command(self, command: str) -> ToolResult:
        result = self.sandbox.run(
            shlex.split(command),
            timeout=self.policy.command_timeout,
            should_stop=self.should_stop,
        )
        # A non-zero exit is information for the model (a failing test it reproduces),
        # not a failed tool call.
        status = "timed_out" if result.timed_out else "completed"
        code = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return ToolResult(
            status,
            f"[{code}]\n{result.output[-8000:]}",
            {"exit_code": result.exit_code, "duration_ms": result.duration_ms},
        )

    def _tool_finish(self, summary: str = "") -> ToolResult:
        return ToolResult("completed", summary or "finished", finished=True)
