"""The README's "your first task" run as written against the server ``make serve`` starts
(its worker running as root, so commands run as the unprivileged sandbox uid), on a
pytest repository and on a Node repository: with the defaults ``repository_add`` picks,
each run detects the test command, installs the test dependencies in its setup (network
only there) and passes verification."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, Task
from tests.browser.conftest import (  # noqa: F401 (fixtures used by name)
    SERVED_DB,
    _serve_env,
    flush_retried_on_deadlock,
    served,
)
from tests.browser.test_readme_first_task import _readme_block
from tests.conftest import ROOT, wait_for
from tests.runs.ordinary_repositories import (
    NODE_FIX,
    PYTEST_FIX,
    node_repository_create,
    pytest_repository_create,
)

pytestmark = SERVED_DB

# The README's request, as a reader sends it; the scripted model's transcript is the
# one addition, since the default model has nothing to say.
INSTRUCTION = '\\"instruction\\": \\"Fix the failing test\\"}'
WITH_SCRIPT = '\\"instruction\\": \\"Fix the failing test\\", \\"model_options\\": $MODEL_OPTIONS}'


def _first_task(served_url: str, repository: Path, script: dict[str, Any]) -> dict[str, Any]:
    commands = _readme_block()
    script_text = "set -euo pipefail\n" + "\n".join(commands)
    assert script_text.count(INSTRUCTION) == 1, "the README's request changed"
    script_text = script_text.replace(INSTRUCTION, WITH_SCRIPT)
    done = subprocess.run(
        ["bash", "-c", script_text],
        cwd=ROOT,
        env={
            **_serve_env(),
            "MY_REPO": str(repository),
            # Whatever port the server has: the commands follow PORT.
            "PORT": served_url.rsplit(":", 1)[1],
            "MODEL_OPTIONS": json.dumps({"provider": "scripted", "script": script}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("create", "script", "kind", "test_command"),
    [
        (pytest_repository_create, PYTEST_FIX, "python-pytest", ".venv/bin/python -m pytest -q"),
        (node_repository_create, NODE_FIX, "node", "npm test"),
    ],
    ids=["pytest", "node"],
)
def test_the_readme_first_task_passes_on_an_ordinary_repository(
    served: Any,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    create: Any,
    script: Any,
    kind: str,
    test_command: str,
) -> None:
    repository = create(tmp_path / "origin")

    answer = _first_task(served.url, repository, script)

    task = Task.objects.get(pk=answer["task_id"])
    assert (task.repository.test_command, task.repository.setup_command) == ("", "")
    run_id = answer["run_id"]
    wait_for(
        lambda: Run.objects.get(pk=run_id).status in (Run.Status.COMPLETED, Run.Status.FAILED),
        timeout=300,
        message="the run",
    )
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    detected = run.events.get(type="agent.environment.detected").data
    assert (detected["kind"], detected["test_command"]) == (kind, test_command)
    setup = run.events.get(type="agent.setup.completed").data
    assert setup["network"] is True
    verification = run.verifications.get()
    assert (verification.outcome, verification.command) == ("passed", test_command)
