"""The tools a model is offered (JSON schemas), the names real models use for them, and
the check that a call matches its schema before anything runs."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

VIEW_WINDOW = 200
# Names that models trained on other agents call a tool by (SWE-agent's ``bash``,
# OpenHands' ``execute_bash``): the call runs as the tool named here. Arguments the
# target does not take (OpenHands' ``timeout``, ``is_input``, ``security_risk``) are
# dropped rather than refused, since the model was right about everything that matters.
TOOL_ALIASES: dict[str, str] = {"bash": "run_command", "execute_bash": "run_command"}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {
    "type": "string",
    "description": "path relative to the repository root (or absolute under /workspace)",
}
TOOL_SCHEMAS: list[dict[str, Any]] = [
    _tool(
        "repo_map",
        "The repository's most relevant files with their classes and functions (and line "
        "numbers), ranked by how much the rest of the code refers to them and by the "
        "words you give in focus.",
        {"focus": {"type": "string", "description": "words, symbols or paths to favour"}},
        [],
    ),
    _tool(
        "list_files",
        "List the files under a directory (ignored files left out).",
        {"path": {**_PATH, "default": "."}},
        [],
    ),
    _tool(
        "read_file",
        f"View a file with line numbers, {VIEW_WINDOW} lines at a time; pass start_line "
        "and end_line (1-based, inclusive) for another window.",
        {"path": _PATH, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
        ["path"],
    ),
    _tool(
        "search",
        "Search file contents for a regular expression (POSIX extended) with git grep; "
        "ignored files are left out. Returns path:line: text.",
        {
            "pattern": {"type": "string"},
            "path": {**_PATH, "description": "limit to this file or directory"},
            "fixed_string": {"type": "boolean", "description": "match the text literally"},
            "ignore_case": {"type": "boolean"},
        },
        ["pattern"],
    ),
    _tool(
        "replace_text",
        "Replace an exact piece of text in a file. It must occur exactly once unless "
        "count is given; include enough surrounding lines to make it unique. A source file "
        "that would no longer parse is left unchanged and the syntax error is shown; when "
        "the text is not found, the closest lines are shown.",
        {
            "path": _PATH,
            "old": {"type": "string"},
            "new": {"type": "string"},
            "count": {"type": "integer", "description": "replace this many occurrences"},
        },
        ["path", "old", "new"],
    ),
    _tool(
        "insert",
        "Insert text after a line (0 inserts at the top of the file).",
        {"path": _PATH, "line": {"type": "integer", "minimum": 0}, "text": {"type": "string"}},
        ["path", "line", "text"],
    ),
    _tool(
        "undo_edit",
        "Undo the last edit (replace_text, insert or write_file) of a file.",
        {"path": _PATH},
        ["path"],
    ),
    _tool(
        "str_replace_editor",
        "The file editor that SWE-agent and OpenHands models know: view (a file with line "
        "numbers, view_range [start, end] with -1 for the end, or a directory), create "
        "(file_text), str_replace (old_str must occur exactly once), insert (new_str after "
        "insert_line) and undo_edit. The same operations as read_file, write_file, "
        "replace_text, insert and undo_edit.",
        {
            "command": {
                "type": "string",
                "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
            },
            "path": _PATH,
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer", "minimum": 0},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
            },
        },
        ["command", "path"],
    ),
    _tool(
        "write_file",
        "Create a file, or overwrite one completely.",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _tool(
        "run_tests",
        "Run the repository's test command, or only some tests (for example "
        "tests/test_core.py::test_add), and get a summary of the result.",
        {"selection": {"type": "string", "description": "test files or ids to run"}},
        [],
    ),
    _tool(
        "run_command",
        "Run a shell command allowed by the repository's policy, in the repository root "
        "or in cwd. Pipes, && and 2>&1 work; a non-zero exit code is reported, not an "
        "error.",
        {"command": {"type": "string"}, "cwd": {**_PATH, "description": "working directory"}},
        ["command"],
    ),
    _tool(
        "ask_user",
        "Ask a person a question when the task is ambiguous and guessing could do harm "
        "(which module owns a new class, which of two behaviours is wanted). The run "
        "waits for the answer, which comes back as this call's result. Offer choices "
        "when the answer is one of a few.",
        {
            "question": {"type": "string"},
            "choices": {"type": "array", "items": {"type": "string"}},
        },
        ["question"],
    ),
    _tool(
        "finish",
        "Stop editing; the patch is ready for verification.",
        {"summary": {"type": "string"}},
        [],
    ),
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOL_SCHEMAS)
EDIT_TOOLS = frozenset({"replace_text", "write_file", "insert", "undo_edit", "str_replace_editor"})


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
    if name in TOOL_ALIASES and _schema_of(TOOL_ALIASES[name], tools) is not None:
        name, arguments = tool_alias_resolve(name, arguments)
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


def tool_alias_resolve(name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool an aliased call means, with the arguments that tool takes."""
    target = TOOL_ALIASES.get(name)
    if target is None:
        return name, arguments
    schema = _schema_of(target, TOOL_SCHEMAS)
    accepted = set(schema["parameters"]["properties"]) if schema else set()
    return target, {k: v for k, v in arguments.items() if k in accepted}
