"""The tools a model may call, confined to the run's sandbox and the repository's policy."""

from __future__ import annotations

import contextlib
import difflib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runs.agent import safefs
from runs.agent.artifacts import redact
from runs.agent.asking import ask_check
from runs.agent.languages import syntax_error
from runs.agent.repomap import repo_map
from runs.agent.sandbox import Sandbox
from runs.agent.tool_policy import ToolDenied, ToolPolicy, command_check, path_is_forbidden
from runs.agent.tool_schemas import (
    EDIT_TOOLS,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    VIEW_WINDOW,
    tool_alias_resolve,
    tool_call_problem,
)
from runs.agent.verify import verification_summary

__all__ = ["TOOL_SCHEMAS", "ToolDenied", "ToolPolicy", "Toolbox", "tool_call_problem"]

MAX_READ_BYTES = 2 * 1024 * 1024
MAX_SEARCH_HITS = 200
UNDO_DEPTH = 5
# Where models expect the repository to be: SWE-agent/OpenHands images mount it at
# /workspace, SWE-bench at /testbed. An absolute path under one of these (or under the
# root the sandbox shows commands) means the same file in the working copy.
WORKING_ROOTS = ("/workspace", "/testbed")
HINT_MIN_RATIO = 0.5


@dataclass
class ToolResult:
    status: str  # completed | failed | denied | timed_out
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    @property
    def denied(self) -> bool:
        return self.status == "denied"


def closest_match_hint(content: str, wanted: str) -> str:
    """The lines of ``content`` most like ``wanted`` (difflib), shown with line numbers.

    Models most often miss by indentation, a quote style or a line they remembered
    wrong; the nearest window of the same number of lines shows them what is there.
    """
    lines = content.splitlines()
    want = wanted.strip("\n").splitlines()
    if not lines or not want or len(lines) > 20_000:
        return ""
    size = min(len(want), len(lines))
    target = "\n".join(line.strip() for line in want)
    best, best_ratio = 0, 0.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)
    for start in range(len(lines) - size + 1):
        window = "\n".join(line.strip() for line in lines[start : start + size])
        matcher.set_seq1(window)
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = start, ratio
    if best_ratio < HINT_MIN_RATIO:
        return ""
    first, last = best + 1, best + size
    return (
        f"\nThe closest text (lines {first}-{last}, {best_ratio:.0%} similar) is:\n"
        f"{_numbered(lines, first, last)}"
    )


def _numbered(lines: list[str], first: int, last: int) -> str:
    return "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(first, last + 1))


class Toolbox:
    """Executes tool calls against one sandbox under one policy.

    ``history`` holds earlier versions of edited files for undo_edit; the caller keeps
    it in the run's checkpoint so an undo still works after the step is re-executed.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        policy: ToolPolicy,
        should_stop: Callable[[], bool] | None = None,
        *,
        test_command: str = "",
        history: dict[str, list[str]] | None = None,
        focus: str = "",
    ) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.should_stop = should_stop
        self.test_command = test_command
        self.history: dict[str, list[str]] = history if history is not None else {}
        self.focus = focus

    @property
    def roots(self) -> tuple[str, ...]:
        shown = getattr(self.sandbox, "inside", "") or str(self.sandbox.path)
        return tuple(dict.fromkeys([*WORKING_ROOTS, shown]))

    def resolve(self, name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The call as the tools take it: an alias named by its tool, absolute paths under
        a working root made repository-relative (anything else stays as written, for
        safefs to refuse)."""
        name, arguments = tool_alias_resolve(name, arguments)
        mapped = dict(arguments)
        for key in ("path", "cwd"):
            if isinstance(mapped.get(key), str):
                with contextlib.suppress(safefs.UnsafePath):
                    mapped[key] = safefs.from_root(mapped[key], self.roots)
        return name, mapped

    def check(self, name: str, arguments: dict[str, Any]) -> None:
        """Raise ToolDenied if the call breaks policy; called before the call starts."""
        name, arguments = self.resolve(name, arguments)
        if name not in TOOL_NAMES:
            raise ToolDenied(f"unknown tool {name!r}")
        paths = [str(arguments[k]) for k in ("path", "cwd") if arguments.get(k)]
        if name in {"list_files", "search"} and not paths:
            paths = ["."]
        for path in paths:
            try:
                relative = safefs.clean(path)
            except safefs.UnsafePath as exc:
                raise ToolDenied(str(exc)) from exc
            # Links are never followed (safefs), so the cleaned path is the only name
            # the call can reach: a "./" prefix or a symlink cannot sneak past the policy.
            if ".git" in relative.split("/"):
                raise ToolDenied("the repository's .git directory is off limits")
            viewing = name == "str_replace_editor" and arguments.get("command") == "view"
            if name in EDIT_TOOLS and not viewing:
                pattern = path_is_forbidden(relative, self.policy.forbidden_paths)
                if pattern:
                    raise ToolDenied(f"path {path!r} is forbidden by policy ({pattern})")
        if name == "run_command":
            command_check(str(arguments.get("command", "")), self.policy.allowed_commands)

    def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run the tool; its output is redacted of known secret patterns.

        Redaction is the second line of defence: the walls (safefs, the sandbox) keep
        secrets out of reach; this catches what a repository itself holds.
        """
        name, arguments = self.resolve(name, arguments)
        handler = getattr(self, f"_tool_{name}")
        try:
            result: ToolResult = handler(**arguments)
        except TypeError as exc:
            result = ToolResult("failed", f"bad arguments for {name}: {exc}")
        except safefs.UnsafePath as exc:
            result = ToolResult("denied", f"refused: {exc}")
        except FileNotFoundError:
            result = ToolResult("completed", f"error: {arguments.get('path')!r} does not exist")
        except (OSError, UnicodeDecodeError, re.error) as exc:
            result = ToolResult("failed", f"{type(exc).__name__}: {exc}")
        result.output = redact(result.output)
        return result

    # --- helpers ----------------------------------------------------------------------

    def _git(self, *args: str) -> tuple[int, str]:
        """A read-only git command in the sandbox: the working copy's .git is the
        agent's, so its configuration may be hostile and is only ever used inside."""
        result = self.sandbox.run(
            ["git", "--no-pager", "-c", "core.quotePath=false", *args],
            timeout=60,
            should_stop=self.should_stop,
        )
        if result.timed_out:
            return 2, "timed out"
        return result.exit_code or 0, result.output

    def _files(self, path: str = ".") -> list[str]:
        """Tracked and untracked files that .gitignore does not exclude."""
        relative = safefs.clean(path) or "."
        code, output = self._git(
            "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", relative
        )
        if code != 0:
            return [entry.path for entry in safefs.walk(self.sandbox.path, path)]
        return sorted({p for p in output.split("\0") if p})

    def _edited(self, path: str, before: str, after: str) -> ToolResult | None:
        """Write ``after`` unless it breaks a source file that parsed; remember ``before``."""
        error = syntax_error(path, after)
        if error and not syntax_error(path, before):
            line = re.search(r"line (\d+)", error)
            lines = after.splitlines()
            at = int(line.group(1)) if line else 1
            first, last = max(1, at - 3), min(len(lines), at + 3)
            return ToolResult(
                "completed",
                f"error: the edit was NOT applied: {path} would no longer parse "
                f"({error}). The edited text would read:\n"
                f"{_numbered(lines, first, last)}",
                {"applied": False},
            )
        versions = self.history.setdefault(safefs.clean(path), [])
        versions.append(before)
        del versions[:-UNDO_DEPTH]
        safefs.write_text(self.sandbox.path, path, after)
        return None

    def _window(self, path: str, text: str, around: int) -> str:
        lines = text.splitlines()
        first, last = max(1, around - 4), min(len(lines), around + 6)
        return f"{path} lines {first}-{last} now:\n{_numbered(lines, first, last)}"

    # --- the tools --------------------------------------------------------------------
    # Every file access goes through safefs: no link is followed, nothing outside the
    # working copy is reachable, whatever the repository or a command planted.

    def _tool_repo_map(self, focus: str = "") -> ToolResult:
        text = repo_map(self.sandbox.path, self._files(), focus=f"{self.focus} {focus}")
        return ToolResult("completed", text)

    def _tool_list_files(self, path: str = ".") -> ToolResult:
        files = self._files(path)
        shown = files[:500]
        output = "\n".join(shown)
        if len(files) > len(shown):
            output += (
                f"\n[... {len(files) - len(shown)} more files not shown; list a "
                "subdirectory or use search ...]"
            )
        return ToolResult("completed", output, {"count": len(files)})

    def _tool_read_file(
        self, path: str, start_line: int | None = None, end_line: int | None = None
    ) -> ToolResult:
        if safefs.kind(self.sandbox.path, path) == "dir":
            return self._tool_list_files(path)
        raw = safefs.read_bytes(self.sandbox.path, path, limit=MAX_READ_BYTES)
        text = raw.decode("utf-8", errors="replace")
        lines = text.splitlines()
        total = len(lines)
        first = min(max(1, start_line or 1), max(total, 1))
        last = min(total, end_line or first + VIEW_WINDOW - 1)
        if last - first + 1 > VIEW_WINDOW * 2:
            last = first + VIEW_WINDOW * 2 - 1
        parts = [f"[{path}: {total} lines; showing {first}-{last}]"]
        if first > 1:
            parts.append(f"[... lines 1-{first - 1} above ...]")
        parts.append(_numbered(lines, first, last))
        if last < total:
            parts.append(
                f"[... lines {last + 1}-{total} below; read_file with start_line={last + 1} "
                "to continue ...]"
            )
        if len(raw) >= MAX_READ_BYTES:
            parts.append(f"[file is larger than {MAX_READ_BYTES} bytes; the rest is not shown]")
        return ToolResult("completed", "\n".join(parts), {"lines": total})

    def _tool_search(
        self,
        pattern: str,
        path: str = ".",
        fixed_string: bool = False,
        ignore_case: bool = False,
    ) -> ToolResult:
        args = ["grep", "-n", "-I", "--untracked", "--no-color", "--full-name"]
        args += ["-F"] if fixed_string else ["-E"]
        if ignore_case:
            args.append("-i")
        code, output = self._git(*args, "-e", pattern, "--", safefs.clean(path) or ".")
        if code == 1 and not output.strip():
            return ToolResult("completed", f"no matches for {pattern!r}", {"hits": 0})
        if code not in (0, 1):
            return ToolResult("completed", f"error: search failed: {output.strip()[:500]}")
        lines = [line[:300] for line in output.splitlines()]
        shown = lines[:MAX_SEARCH_HITS]
        text = "\n".join(shown)
        if len(lines) > len(shown):
            text += (
                f"\n[... {len(lines) - len(shown)} more matches; narrow the pattern or path ...]"
            )
        return ToolResult("completed", text, {"hits": len(lines)})

    def _tool_replace_text(self, path: str, old: str, new: str, count: int = 0) -> ToolResult:
        content = safefs.read_text(self.sandbox.path, path)
        found = content.count(old) if old else 0
        if found == 0:
            return ToolResult(
                "completed",
                f"error: the text to replace was not found in {path}; nothing changed. "
                "Copy it exactly from read_file output (without the line numbers)."
                + closest_match_hint(content, old),
                {"applied": False},
            )
        if count == 0 and found > 1:
            starts = [m.start() for m in re.finditer(re.escape(old), content)]
            at = [content.count("\n", 0, i) + 1 for i in starts][:20]
            return ToolResult(
                "completed",
                f"error: the text occurs {found} times in {path} (lines "
                f"{', '.join(map(str, at))}); nothing changed. Include more surrounding "
                "lines to make it unique, or pass count.",
                {"applied": False},
            )
        after = content.replace(old, new, count or 1)
        refused = self._edited(path, content, after)
        if refused:
            return refused
        line = content.count("\n", 0, content.index(old)) + 1
        return ToolResult(
            "completed",
            f"replaced {count or 1} occurrence(s) in {path}.\n{self._window(path, after, line)}",
            {"applied": True},
        )

    def _tool_insert(self, path: str, line: int, text: str) -> ToolResult:
        content = safefs.read_text(self.sandbox.path, path)
        lines = content.splitlines(keepends=True)
        if line > len(lines):
            return ToolResult(
                "completed", f"error: {path} has only {len(lines)} lines; nothing changed"
            )
        if lines and not lines[-1].endswith("\n") and line == len(lines):
            lines[-1] += "\n"
        insert = text if text.endswith("\n") else text + "\n"
        after = "".join([*lines[:line], insert, *lines[line:]])
        refused = self._edited(path, content, after)
        if refused:
            return refused
        return ToolResult(
            "completed",
            f"inserted after line {line} of {path}.\n{self._window(path, after, line + 1)}",
            {"applied": True},
        )

    def _tool_undo_edit(self, path: str) -> ToolResult:
        versions = self.history.get(safefs.clean(path)) or []
        if not versions:
            return ToolResult("completed", f"error: no edit of {path} to undo")
        previous = versions.pop()
        safefs.write_text(self.sandbox.path, path, previous)
        return ToolResult("completed", f"restored {path} to its content before the last edit")

    def _tool_str_replace_editor(
        self,
        command: str,
        path: str,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> ToolResult:
        def missing(argument: str) -> ToolResult:
            return ToolResult("completed", f"error: {command} needs {argument}; nothing changed")

        if command == "view":
            start, end = (view_range or [0, -1])[:2]
            return self._tool_read_file(path, start or None, None if end == -1 else end)
        if command == "create":
            if file_text is None:
                return missing("file_text")
            return self._tool_write_file(path, file_text)
        if command == "str_replace":
            if old_str is None:
                return missing("old_str")
            return self._tool_replace_text(path, old_str, new_str or "")
        if command == "insert":
            if insert_line is None or new_str is None:
                return missing("insert_line and new_str")
            return self._tool_insert(path, insert_line, new_str)
        return self._tool_undo_edit(path)

    def _tool_write_file(self, path: str, content: str) -> ToolResult:
        try:
            before = safefs.read_text(self.sandbox.path, path)
        except FileNotFoundError:
            before = None
        if before is not None:
            refused = self._edited(path, before, content)
            if refused:
                return refused
        else:
            safefs.write_text(self.sandbox.path, path, content)
        error = syntax_error(path, content)
        note = f" (warning: it does not parse: {error})" if error else ""
        return ToolResult("completed", f"wrote {len(content)} characters to {path}{note}")

    def _run(self, command: str, cwd: str = "") -> Any:
        argv = ["bash", "-c", command]
        if cwd and safefs.clean(cwd):
            argv = ["env", f"--chdir={safefs.clean(cwd)}", *argv]
        return self.sandbox.run(
            argv, timeout=self.policy.command_timeout, should_stop=self.should_stop
        )

    def _tool_run_tests(self, selection: str = "") -> ToolResult:
        if not self.test_command:
            return ToolResult("completed", "error: the repository has no test command")
        command = self.test_command
        if selection:
            command += " " + " ".join(shlex.quote(part) for part in shlex.split(selection))
        result = self._run(command)
        if result.timed_out:
            return ToolResult("timed_out", f"[timed out]\n{verification_summary(result.output)}")
        verdict = "passed" if result.exit_code == 0 else f"failed (exit code {result.exit_code})"
        return ToolResult(
            "completed",
            f"[tests {verdict}: {command}]\n{verification_summary(result.output)}",
            {"exit_code": result.exit_code, "duration_ms": result.duration_ms},
        )

    def _tool_run_command(self, command: str, cwd: str = "") -> ToolResult:
        result = self._run(command, cwd)
        # A non-zero exit is information for the model (a failing test it reproduces),
        # not a failed tool call.
        status = "timed_out" if result.timed_out else "completed"
        code = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return ToolResult(
            status,
            f"[{code}]\n{result.output[-16000:]}",
            {"exit_code": result.exit_code, "duration_ms": result.duration_ms},
        )

    def _tool_finish(self, summary: str = "") -> ToolResult:
        return ToolResult("completed", summary or "finished", finished=True)

    def _tool_ask_user(self, question: str, choices: list[str] | None = None) -> ToolResult:
        # The pause itself is the running step's (runs.steps.asking): a tool cannot wait.
        status, output, offered = ask_check(question, choices)
        return ToolResult(status, output, {"choices": offered} if offered else {})
