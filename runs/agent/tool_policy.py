"""What a repository's policy allows a tool call: paths it may touch, commands it may run."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from dataclasses import dataclass, field

# Words of a command line that join commands; each joined command is checked.
COMMAND_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
SHELL_BUILTINS = frozenset({"cd", "true", "false", "echo", "test", "["})
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class ToolPolicy:
    forbidden_paths: list[str] = field(default_factory=list)
    allowed_commands: list[str] = field(default_factory=list)
    command_timeout: float = 300


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


def command_check(command: str, allowed: list[str]) -> list[str]:
    """The commands a command line runs, or ToolDenied saying what the policy refuses.

    The line is split with a shell lexer, so quoted text (``grep "a|b"``) is an
    argument, not an operator. Every command of a pipeline or ``&&`` chain must be
    allowed (``cd`` and a few builtins always are); redirections are allowed,
    command substitution is not, because it hides what runs.
    """
    if "`" in command or "$(" in command or "<(" in command or ">(" in command:
        raise ToolDenied("command substitution is not allowed; run the commands one by one")
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as exc:
        raise ToolDenied(f"command does not parse: {exc}") from exc
    if not words:
        raise ToolDenied("empty command")
    names = {posixpath.basename(c) for c in allowed} | set(allowed)
    programs: list[str] = []
    expect_program = True
    for word in words:
        if word in COMMAND_SEPARATORS:
            expect_program = True
        elif set(word) <= set("<>&") and word:
            pass  # a redirection operator; its target follows
        elif expect_program and ENV_ASSIGNMENT.match(word):
            pass
        elif expect_program:
            programs.append(word)
            known = word in names or posixpath.basename(word) in names
            if word not in SHELL_BUILTINS and not known:
                raise ToolDenied(
                    f"command {word!r} is not in the allowed commands "
                    f"({', '.join(sorted(set(allowed)))})"
                )
            expect_program = False
    if not programs:
        raise ToolDenied("no command to run")
    return programs
