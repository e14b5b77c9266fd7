"""A run recorded against a local Chat Completions server whose requests are counted."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runs.engine import run_drive_inline
from runs.models import Run
from runs.services import task_submit
from tests.runs.agent.test_agent_awkward_model import _body, _call
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer

FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}
# Plan, then three acting turns, then finish: five model turns.
SCRIPT: list[bytes] = [
    _body("1. Read calc/core.py 2. Fix add 3. Finish"),
    _body("Reading.", [_call("read_file", {"path": "calc/core.py"}, "c1")]),
    _body("Fixing.", [_call("replace_text", FIX, "c2")]),
    _body(
        None, [_call("run_command", {"command": "python3 -m unittest discover -s tests -q"}, "c3")]
    ),
    _body(None, [_call("finish", {"summary": "add() fixed"}, "c4")]),
]


@contextlib.contextmanager
def model_server(settings: Any, name: str, offset: int = 0) -> Iterator[ChatCompletionsServer]:
    """Profile ``name`` at a server playing SCRIPT from turn ``offset`` + 1."""

    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        index = min(offset + n - 1, len(SCRIPT) - 1)
        return 200, {}, SCRIPT[index]

    with ChatCompletionsServer(respond) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            name: {
                "provider": "openai",
                "model": "gpt-4o",
                "base_url": server.base_url,
                "api_key_env": "REPLAY_TEST_KEY",
            },
        }
        yield server


def recorded_run(workspace: Any, repository: Any, profile: str, **options: Any) -> Run:
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"profile": profile},
        **options,
    )
    run = run_drive_inline(run_id=submission.run.id)
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    return run


def push_change(bare: Path, tmp: Path, path: str, content: str) -> None:
    """A new commit on the origin's main branch that rewrites ``path``."""
    work = tmp / "pusher"
    subprocess.run(["git", "clone", "--quiet", str(bare), str(work)], check=True)
    (work / path).write_text(content)
    for args in (
        ["add", "--all"],
        ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "--quiet", "-m", "change"],
        ["push", "--quiet", "origin", "HEAD:main"],
    ):
        subprocess.run(["git", *args], cwd=work, check=True)
