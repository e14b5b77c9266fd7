"""Source languages the agent understands: parsers, symbol queries and syntax checks.

Grammars come from ``tree-sitter-language-pack`` (the 0.x series, whose wheels carry
every grammar: the 1.x series downloads them at run time, and a worker may have no
network). A file's language is chosen by its extension. Any language the pack parses
gets a syntax check; the languages with a symbol query below also get a repository
map entry (classes, functions, methods, types with their line numbers).
"""

from __future__ import annotations

import functools
import posixpath
from typing import Any

import tree_sitter
from tree_sitter_language_pack import get_language, get_parser

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".java": "java",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".cs": "csharp",
    ".rb": "ruby",
    ".php": "php",
    ".kt": "kotlin",
    ".scala": "scala",
    ".swift": "swift",
    ".lua": "lua",
    ".sh": "bash",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
}

_JS_DEFINITIONS = """
(function_declaration name: (identifier) @def.function)
(generator_function_declaration name: (identifier) @def.function)
(method_definition name: (property_identifier) @def.method)
(variable_declarator name: (identifier) @def.function
  value: [(arrow_function) (function_expression)])
(identifier) @ref
(property_identifier) @ref
"""
_TS_DEFINITIONS = (
    _JS_DEFINITIONS
    + """
(class_declaration name: (type_identifier) @def.class)
(interface_declaration name: (type_identifier) @def.interface)
(type_alias_declaration name: (type_identifier) @def.type)
(enum_declaration name: (identifier) @def.enum)
(type_identifier) @ref
"""
)
SYMBOL_QUERIES: dict[str, str] = {
    "python": """
(class_definition name: (identifier) @def.class)
(function_definition name: (identifier) @def.function)
(identifier) @ref
""",
    "javascript": _JS_DEFINITIONS + "(class_declaration name: (identifier) @def.class)\n",
    "typescript": _TS_DEFINITIONS,
    "tsx": _TS_DEFINITIONS,
    "go": """
(function_declaration name: (identifier) @def.function)
(method_declaration name: (field_identifier) @def.method)
(type_spec name: (type_identifier) @def.type)
(identifier) @ref
(field_identifier) @ref
(type_identifier) @ref
""",
    "java": """
(class_declaration name: (identifier) @def.class)
(interface_declaration name: (identifier) @def.interface)
(enum_declaration name: (identifier) @def.enum)
(record_declaration name: (identifier) @def.class)
(method_declaration name: (identifier) @def.method)
(constructor_declaration name: (identifier) @def.method)
(identifier) @ref
(type_identifier) @ref
""",
    "rust": """
(function_item name: (identifier) @def.function)
(struct_item name: (type_identifier) @def.struct)
(enum_item name: (type_identifier) @def.enum)
(trait_item name: (type_identifier) @def.trait)
(type_item name: (type_identifier) @def.type)
(mod_item name: (identifier) @def.module)
(macro_definition name: (identifier) @def.macro)
(identifier) @ref
(type_identifier) @ref
(field_identifier) @ref
""",
}


def language_of(path: str) -> str:
    """The pack's name for ``path``'s language, or "" when it is not a known source file."""
    return EXTENSIONS.get(posixpath.splitext(path)[1].lower(), "")


@functools.cache
def parser_for(language: str) -> Any:
    return get_parser(language)  # type: ignore[arg-type]


@functools.cache
def symbol_query(language: str) -> tree_sitter.Query | None:
    text = SYMBOL_QUERIES.get(language)
    if text is None:
        return None
    return tree_sitter.Query(get_language(language), text)  # type: ignore[arg-type]


def _first_error(node: tree_sitter.Node) -> tree_sitter.Node | None:
    """The first ERROR or MISSING node in document order (a tree's own error flags lead
    the way, so only subtrees that contain one are searched)."""
    if node.is_error or node.is_missing:
        return node
    for child in node.children:
        if child.has_error:
            found = _first_error(child)
            if found is not None:
                return found
    return None


def syntax_error(path: str, text: str) -> str:
    """Why ``text`` does not parse as ``path``'s language, or "" (also for unknown ones).

    Python gets the interpreter's own message, which is exact; every other language
    gets the position of tree-sitter's first error or missing token.
    """
    language = language_of(path)
    if not language:
        return ""
    if language == "python":
        try:
            compile(text, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"SyntaxError: {exc.msg} at line {exc.lineno}"
        except ValueError as exc:
            return str(exc)
        return ""
    tree = parser_for(language).parse(text.encode("utf-8"))
    if not tree.root_node.has_error:
        return ""
    node = _first_error(tree.root_node) or tree.root_node
    row, column = node.start_point
    if node.is_missing:
        what = f"missing {node.type!r}"
    else:
        snippet = (node.text or b"").decode("utf-8", errors="replace").strip().splitlines()
        what = f"unexpected {snippet[0][:40]!r}" if snippet else "syntax error"
    return f"{language} syntax error: {what} at line {row + 1}, column {column + 1}"
