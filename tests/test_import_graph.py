"""Imports point down: the project's modules form no import cycle (docs/design.md §2).

The graph is read with ``ast`` from every module of the project's packages (migrations
left out): module-level imports, imports inside functions and
``importlib.import_module("...")`` with a constant name. A relative import is resolved
against its package, and ``from pkg import name`` points at ``pkg.name`` when that is a
module. Importing ``a.b.c`` also runs ``a`` and ``a.b``, so each edge also points at
the parent packages of its target, except the importing module's own packages, which
Python initialises before the module itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_services

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentplatform", "runs", "jobs", "webhooks", "bench")

# Function-local imports between project modules that a library forces, each with why.
# A key is a module (all its local imports) or "module -> imported module".
LOCAL_IMPORTS_ALLOWED: dict[str, str] = {
    "runs.apps": "AppConfig.ready: Django imports apps.py before any model can load",
    "jobs.apps": "AppConfig.ready: Django imports apps.py before any model can load",
    "webhooks.apps": "AppConfig.ready: Django imports apps.py before any model can load",
    "agentplatform.celery": (
        "the Celery app loads with the settings (agentplatform/__init__), before Django's "
        "app registry: its signal handlers import what needs the registry"
    ),
    "runs.providers -> runs.providers.llm": (
        "LiteLLM takes seconds to import: only the processes that call a model pay for it"
    ),
    "bench": "benchmark scripts call django.setup() before they may import a model",
}


def _module_files(root: Path) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_package(module: str, modules: dict[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module, modules):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(name: str, modules: dict[str, Path]) -> list[str]:
    """The project modules that importing ``name`` runs: it and its parent packages."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules]


class _Imports(ast.NodeVisitor):
    """Collects (imported module, is function-local, line) for one module."""

    def __init__(self, module: str, modules: dict[str, Path]) -> None:
        self.module = module
        self.modules = modules
        self.depth = 0
        self.found: list[tuple[str, bool, int]] = []

    def _add(self, name: str, line: int) -> None:
        # A module's own packages are always initialised before it runs.
        ancestors = {
            ".".join(self.module.split(".")[:i]) for i in range(1, self.module.count(".") + 2)
        }
        for target in _targets(name, self.modules):
            if target not in ancestors:
                self.found.append((target, self.depth > 0, line))

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        # ``if TYPE_CHECKING:`` imports never run.
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.module, node, self.modules)
        self._add(base, node.lineno)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.modules:
                self._add(submodule, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = getattr(func, "id", None) or getattr(func, "attr", None)
        if (
            name == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self._add(node.args[0].value, node.lineno)
        self.generic_visit(node)


def import_edges(root: Path) -> dict[str, list[tuple[str, bool, int]]]:
    """For each project module, the project modules it imports."""
    modules = _module_files(root)
    edges: dict[str, list[tuple[str, bool, int]]] = {}
    for module, path in modules.items():
        visitor = _Imports(module, modules)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        edges[module] = visitor.found
    return edges


def cycles(edges: dict[str, list[tuple[str, bool, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {module: sorted({target for target, _, _ in found}) for module, found in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            neighbours = graph.get(node, [])
            if child < len(neighbours):
                work.append((node, child + 1))
                target = neighbours[child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(components, key=len, reverse=True)


def _allowed(module: str, target: str) -> bool:
    parts = module.split(".")
    owners = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return bool(owners & set(LOCAL_IMPORTS_ALLOWED)) or (
        f"{module} -> {target}" in LOCAL_IMPORTS_ALLOWED
    )


def local_imports(edges: dict[str, list[tuple[str, bool, int]]]) -> list[str]:
    """Function-local imports, one per imported module (its parent packages left out)."""
    found = []
    for module, targets in sorted(edges.items()):
        named = {(target, line) for target, local, line in targets if local}
        for target, line in sorted(named, key=lambda pair: (pair[1], pair[0])):
            if any(other.startswith(f"{target}.") and at == line for other, at in named):
                continue
            if not _allowed(module, target):
                found.append(f"{module}:{line} imports {target} inside a function")
    return found


def test_the_project_has_no_import_cycle() -> None:
    edges = import_edges(ROOT)
    assert len(edges) > 100
    found = cycles(edges)
    assert found == [], "\n".join(
        f"cycle of {len(component)}: {', '.join(component)}" for component in found
    )


def test_project_modules_import_each_other_at_module_level() -> None:
    found = local_imports(import_edges(ROOT))
    assert found == [], f"{len(found)} function-local imports:\n" + "\n".join(found)


def test_the_allowed_local_imports_still_exist() -> None:
    edges = import_edges(ROOT)
    local = {
        (module, target)
        for module, found in edges.items()
        for target, is_local, _ in found
        if is_local
    }
    present = {module for module, _ in local} | {
        f"{module} -> {target}" for module, target in local
    }
    present |= {module.split(".")[0] for module, _ in local}
    assert set(LOCAL_IMPORTS_ALLOWED) <= present


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_local_relative_and_submodule_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "runs/__init__.py": "",
            "runs/a.py": "def f():\n    from . import b\n",
            "runs/b.py": "from runs.steps import c\n",
            "runs/steps/__init__.py": "",
            "runs/steps/c.py": "import importlib\nimportlib.import_module('runs.a')\n",
            "jobs/__init__.py": "",
            "jobs/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import jobs.e\n",
            "jobs/e.py": "import jobs.d\n",
            "agentplatform/__init__.py": "",
            "webhooks/__init__.py": "",
            "bench/__init__.py": "",
        },
    )
    edges = import_edges(tmp_path)
    assert cycles(edges) == [["runs.a", "runs.b", "runs.steps.c"]]
    assert local_imports(edges) == ["runs.a:2 imports runs.b inside a function"]
