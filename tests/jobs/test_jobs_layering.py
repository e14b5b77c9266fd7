"""``jobs`` is the generic delivery layer: it imports nothing from the domain apps.

The domain plugs in by registration (consumers in settings, schedules and dead-letter
listeners from ``AppConfig.ready``). Every import statement in ``jobs`` is read, module
level or inside a function, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

JOBS = Path(__file__).resolve().parents[2] / "jobs"
DOMAIN = ("runs", "webhooks", "agentplatform")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(str(node.args[0].value))
    return names


def test_jobs_imports_nothing_from_the_domain_apps() -> None:
    offending = []
    files = sorted(JOBS.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in _imports(path):
            if name.split(".")[0] in DOMAIN:
                offending.append(f"{path.relative_to(JOBS.parent)}: {name}")
    assert offending == []


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from runs.models import Run\n    import webhooks.tasks\n")
    assert _imports(module) == ["runs.models", "webhooks.tasks"]
