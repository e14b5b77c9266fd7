"""A repository map in the manner of Aider's: symbols ranked by how much they matter.

Source files in every language with a symbol query (runs.agent.languages: Python,
JavaScript, TypeScript, Go, Java, Rust) are parsed with tree-sitter; their classes,
functions, methods and types are the definitions, the identifiers they use are the
references. A definition ranks by how many other files refer to its name, and much
higher when the task mentions the symbol or its file; files rank by their best
definitions. The map lists the ranked files with their definitions and line numbers
within a character budget, then the names of the other files, so the model sees where
things are before it reads.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import tree_sitter

from runs.agent import safefs
from runs.agent.languages import SYMBOL_QUERIES, language_of, parser_for, symbol_query

MAP_CHAR_BUDGET = 12_000
MAX_FILE_BYTES = 256 * 1024
MAX_PARSED_FILES = 3_000
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


@dataclass
class Definition:
    name: str
    kind: str
    line: int
    text: str


@functools.lru_cache(maxsize=4096)
def _parse(language: str, source: bytes) -> tuple[list[Definition], Counter[str]]:
    """Definitions and references of one file; cached by content, so a map asked for
    again after a few edits parses only the edited files."""
    query = symbol_query(language)
    if query is None:
        return [], Counter()
    tree = parser_for(language).parse(source)
    captures = tree_sitter.QueryCursor(query).captures(tree.root_node)
    lines = source.decode("utf-8", errors="replace").splitlines()
    definitions = []
    seen: set[tuple[str, int]] = set()
    for kind, nodes in captures.items():
        if not kind.startswith("def."):
            continue
        for node in nodes:
            row = node.start_point[0]
            name = (node.text or b"").decode()
            if (name, row) in seen:
                continue
            seen.add((name, row))
            text = lines[row].strip() if row < len(lines) else ""
            definitions.append(Definition(name, kind.split(".")[1], row + 1, text[:120]))
    refs = Counter((node.text or b"").decode() for node in captures.get("ref", []))
    definitions.sort(key=lambda d: d.line)
    return definitions, refs


def repo_map(
    root: Path, files: list[str], *, focus: str = "", budget: int = MAP_CHAR_BUDGET
) -> str:
    """The ranked map of ``files`` (repository-relative) under ``root``."""
    focus_words = set(WORD.findall(focus))
    focus_paths = {w.lower() for w in re.findall(r"[\w./-]+\.\w+", focus)}
    definitions: dict[str, list[Definition]] = {}
    references: dict[str, Counter[str]] = {}
    sources = [(f, language_of(f)) for f in files]
    for path, language in [s for s in sources if s[1] in SYMBOL_QUERIES][:MAX_PARSED_FILES]:
        try:
            source = safefs.read_bytes(root, path, limit=MAX_FILE_BYTES)
        except (OSError, safefs.UnsafePath):
            continue
        definitions[path], references[path] = _parse(language, source)
    referring_files: dict[str, int] = defaultdict(int)
    for refs in references.values():
        for name in refs:
            referring_files[name] += 1
    file_scores: dict[str, float] = {}
    for path, defs in definitions.items():
        score = 0.0
        for d in defs:
            weight = float(referring_files.get(d.name, 0) - 1)  # its own file refers to it too
            if d.name in focus_words:
                weight += 1000
            if d.name.startswith("_"):
                weight *= 0.3
            score += max(weight, 0)
        if path.lower() in focus_paths or any(path.lower().endswith(p) for p in focus_paths):
            score += 2000
        if "test" in path.split("/")[0] or "/tests/" in path or path.startswith("test_"):
            score *= 0.5
        file_scores[path] = score
    ranked = sorted(file_scores, key=lambda p: (-file_scores[p], p))
    out = [f"{len(files)} files; the most referenced first (line: definition)"]
    used = len(out[0])
    shown: set[str] = set()
    for path in ranked:
        defs = definitions[path]
        if not defs:
            continue
        block = [f"{path}:"] + [f"  {d.line}: {d.text}" for d in defs[:40]]
        if len(defs) > 40:
            block.append(f"  ... {len(defs) - 40} more definitions")
        size = sum(len(line) + 1 for line in block)
        if used + size > budget:
            break
        out.extend(block)
        used += size
        shown.add(path)
    rest = [f for f in files if f not in shown]
    if rest:
        out.append("Other files:")
        for index, path in enumerate(rest):
            if used + len(path) + 3 > budget * 1.3:
                out.append(f"[... {len(rest) - index} more files; use list_files ...]")
                break
            out.append(f"  {path}")
            used += len(path) + 3
    return "\n".join(out)
