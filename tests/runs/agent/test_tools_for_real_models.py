"""Tools as real models call them: shell aliases, absolute working-root paths, the
default command list, closest-match hints, and syntax errors fed back in every language
the repository map understands."""

from __future__ import annotations

import subprocess

import pytest

from runs.agent.sandbox import LocalSandbox
from runs.agent.tools import TOOL_SCHEMAS, Toolbox, ToolDenied, ToolPolicy, tool_call_problem
from runs.models import default_allowed_commands

pytestmark = pytest.mark.no_services

FILES = {
    "app.py": "def greet(name):\n    return 'hello ' + name\n",
    "web/app.js": (
        "class Cart {\n  total() {\n    return this.items.length;\n  }\n}\n"
        "function addItem(cart, item) {\n  cart.items.push(item);\n}\n"
        "const removeItem = (cart) => cart.items.pop();\nmodule.exports = { Cart, addItem };\n"
    ),
    "web/types.ts": (
        "export interface Shape { area(): number }\n"
        "export class Circle implements Shape {\n  area(): number { return 3; }\n}\n"
        "export function makeCircle(): Circle { return new Circle(); }\n"
    ),
    "svc/main.go": (
        "package main\n\ntype Server struct{}\n\n"
        "func (s *Server) Serve() error { return nil }\n\nfunc main() {}\n"
    ),
    "src/Main.java": (
        "public class Main {\n  public static void main(String[] args) {}\n"
        "  int compute(int x) { return x; }\n}\n"
    ),
    "lib/src/lib.rs": (
        "pub struct Parser { pos: usize }\n"
        "pub trait Visit { fn visit(&self); }\n"
        "impl Parser { pub fn parse_expr(&self) -> usize { self.pos } }\n"
    ),
}


@pytest.fixture
def toolbox(tmp_path, settings):
    settings.SANDBOX_ROOT = str(tmp_path / "sandboxes")
    sandbox = LocalSandbox("real-models")
    sandbox.create()
    for path, text in FILES.items():
        target = sandbox.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    subprocess.run(["git", "init", "-q", str(sandbox.path)], check=True)
    subprocess.run(["git", "-C", str(sandbox.path), "add", "-A"], check=True)
    policy = ToolPolicy(forbidden_paths=[".github/**"], allowed_commands=default_allowed_commands())
    return Toolbox(sandbox, policy)


def test_repo_map_lists_symbols_of_js_ts_go_java_and_rust_files(toolbox):
    text = toolbox.execute("repo_map", {}).output

    for path, symbols in {
        "web/app.js:": ("class Cart", "total()", "function addItem", "const removeItem"),
        "web/types.ts:": ("interface Shape", "class Circle", "function makeCircle"),
        "svc/main.go:": ("type Server struct", "func (s *Server) Serve()", "func main()"),
        "src/Main.java:": ("public class Main", "int compute(int x)"),
        "lib/src/lib.rs:": ("pub struct Parser", "pub trait Visit", "pub fn parse_expr"),
        "app.py:": ("def greet(name):",),
    }.items():
        block = text.split(path, 1)[1].split("\n\n", 1)[0]
        assert path in text, text
        for symbol in symbols:
            assert symbol in block, (path, symbol, text)


def test_javascript_edit_that_breaks_the_syntax_is_refused_with_the_error(toolbox):
    result = toolbox.execute(
        "replace_text",
        {"path": "web/app.js", "old": "cart.items.push(item);", "new": "cart.items.push(item;"},
    )

    assert result.data["applied"] is False
    assert "NOT applied" in result.output and "javascript syntax error" in result.output
    assert "line 7" in result.output
    assert "push(item);" in (toolbox.sandbox.path / "web/app.js").read_text()
    # The editor every SWE-agent model knows goes through the same check.
    result = toolbox.execute(
        "str_replace_editor",
        {
            "command": "str_replace",
            "path": "svc/main.go",
            "old_str": "main() {}",
            "new_str": "main() {",
        },
    )
    assert "NOT applied" in result.output and "go syntax error" in result.output


def test_absolute_paths_under_a_working_root_reach_the_working_copy(toolbox):
    for root in ("/workspace", "/testbed", toolbox.sandbox.inside):
        toolbox.check("read_file", {"path": f"{root}/app.py"})
        result = toolbox.execute("read_file", {"path": f"{root}/app.py"})
        assert "return 'hello ' + name" in result.output, (root, result.output)
    edit = {"path": "/workspace/app.py", "old": "'hello '", "new": "'hi '"}
    toolbox.check("replace_text", edit)
    assert toolbox.execute("replace_text", edit).data["applied"] is True
    assert "'hi '" in (toolbox.sandbox.path / "app.py").read_text()


@pytest.mark.parametrize(
    "path",
    ["/workspace/../etc/passwd", "/etc/passwd", "/testbed/../../etc/passwd", "/workspacex/a"],
)
def test_absolute_paths_outside_the_working_root_are_refused(toolbox, path):
    with pytest.raises(ToolDenied):
        toolbox.check("read_file", {"path": path})
    result = toolbox.execute("read_file", {"path": path})
    assert result.status == "denied" and "root:" not in result.output


def test_commands_see_the_working_copy_at_workspace_and_testbed(toolbox):
    if not toolbox.sandbox.backend.contains:
        pytest.skip("the process backend shows commands the host path")
    for root in ("/workspace", "/testbed"):
        result = toolbox.execute("run_command", {"command": f"cd {root} && head -1 app.py"})
        assert "def greet(name):" in result.output, (root, result.output)


def test_bash_and_execute_bash_run_as_run_command(toolbox):
    for name in ("bash", "execute_bash"):
        arguments = {"command": "wc -l app.py && head -1 app.py", "timeout": 30}
        assert tool_call_problem(name, arguments, "", TOOL_SCHEMAS) == ""
        toolbox.check(name, arguments)
        result = toolbox.execute(name, arguments)
        assert "2 app.py" in result.output and "def greet" in result.output


@pytest.mark.parametrize(
    "command",
    [
        "python3 -c 'print(1)'",
        "sed -n 1,2p app.py",
        "find . -name '*.py' | head -5",
        "wc -l app.py",
        "pip --version",
        "grep -rn greet . | cat",
        "go version; cargo --version; npm --version; make --version",
    ],
)
def test_default_allow_list_lets_ordinary_commands_run(toolbox, command):
    toolbox.check("run_command", {"command": command})


def test_repository_policy_can_still_narrow_the_list(toolbox):
    toolbox.policy.allowed_commands = ["python3"]
    with pytest.raises(ToolDenied):
        toolbox.check("run_command", {"command": "sed -n 1p app.py"})


def test_failed_exact_match_edit_shows_the_closest_lines(toolbox):
    remembered = "function addItem(cart, item) {\n  cart.items.add(item);"
    result = toolbox.execute("replace_text", {"path": "web/app.js", "old": remembered, "new": "x"})

    assert result.data["applied"] is False
    assert "closest text (lines 6-7" in result.output
    assert "cart.items.push(item);" in result.output
