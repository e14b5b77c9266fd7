"""Edits to forbidden paths are denied, recorded and reported as policy denials."""

from __future__ import annotations

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Run, ToolCall
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

FORBIDDEN_WRITES = [
    {"name": "write_file", "arguments": {"path": ".github/workflows/ci.yml", "content": "x"}},
    {"name": "write_file", "arguments": {"path": "./.env", "content": "TOKEN=1"}},
    {"name": "write_file", "arguments": {"path": "calc/../deploy/key.pem", "content": "k"}},
    {"name": "write_file", "arguments": {"path": ".git/hooks/pre-push", "content": "#!"}},
    {"name": "read_file", "arguments": {"path": "../../etc/passwd"}},
]


def test_forbidden_path_edit_is_denied_and_the_run_goes_on(workspace, repository):
    script = demo.fix_script()
    script["turns"].insert(0, {"content": "Trying things.", "tool_calls": FORBIDDEN_WRITES})
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    denied = ToolCall.objects.filter(run=run, status="denied").order_by("id")
    assert [c.arguments["path"] for c in denied] == [
        c["arguments"]["path"] for c in FORBIDDEN_WRITES
    ]
    assert "forbidden by policy (.github/workflows/**)" in denied[0].error
    assert "(.env*)" in denied[1].error and "(*.pem)" in denied[2].error
    assert ".git directory" in denied[3].error and "outside" in denied[4].error
    policy = run.events.filter(type="agent.policy.denied")
    assert policy.count() == len(FORBIDDEN_WRITES)
    assert run.events.filter(type="agent.tool.call.denied").count() == len(FORBIDDEN_WRITES)
    # Denied calls never start.
    started = set(
        run.events.filter(type="agent.tool.call.started").values_list(
            "data__tool_call_id", flat=True
        )
    )
    assert not started & {c.call_id for c in denied}
    patch = run.patches.get()
    assert patch.files_changed == ["calc/core.py"]
