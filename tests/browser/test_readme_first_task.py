"""The README's "your first task on your own repository", run as written against the
server ``make serve`` starts, on a fresh database: at most five commands."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from runs.models import ApiToken, Membership, Repository, Run, Task, Workspace
from runs.state import TERMINAL
from tests.browser.conftest import SERVED_DB, _serve_env
from tests.conftest import ROOT, wait_for

pytestmark = SERVED_DB


def _readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- first-task:begin -->\n```sh\n(.*?)```\n<!-- first-task:end -->", text, re.S
    )
    assert block, "the README lost its first-task block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_first_task_runs_as_written(served: Any, sample_repo: Any) -> None:
    commands = _readme_block()
    assert len(commands) + 1 <= 5  # and `make serve`, already running
    assert not Workspace.objects.exists()  # a fresh database: nothing made beforehand
    # Written for any port: the server's own is given as a reader sets it.
    assert "127.0.0.1:8000" not in "\n".join(commands)
    script = "set -euo pipefail\n" + "\n".join(commands)
    port = served.url.rsplit(":", 1)[1]

    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**_serve_env(), "MY_REPO": str(sample_repo), "PORT": port},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    task = Task.objects.get(pk=answer["task_id"])
    assert answer["status"] == "queued" and answer["run_id"]
    assert (task.workspace.slug, task.source, task.requested_by) == ("acme", "api", "alice")
    assert task.repository == Repository.objects.get(name="mine", clone_url=str(sample_repo))
    assert Membership.objects.get(user__username="alice").role == "admin"
    assert ApiToken.objects.filter(user__username="alice").count() == 1
    # The server's own worker takes the run through to an end.
    run = Run.objects.get(pk=answer["run_id"])
    wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=120, message="the run")
    assert run.events.filter(type="agent.run.started").exists()
