"""A secret in the diff is blocked by the judge and never stored in an artifact."""

from __future__ import annotations

import pytest

from runs import demo
from runs.engine import run_drive_inline
from runs.models import Artifact, PullRequest, Run
from runs.services import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

AWS_KEY = "AKIA" + "Q" * 16


def test_secret_in_diff_blocks_the_run(workspace, repository):
    script = demo.fix_script()
    script["turns"].insert(
        2,
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {
                        "path": "calc/settings.py",
                        "content": f'AWS_ACCESS_KEY_ID = "{AWS_KEY}"\n',
                    },
                }
            ]
        },
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.FAILED
    assert run.failure_reason == "judge_blocked"
    judgement = run.judgements.get(judge="rules")
    assert judgement.verdict == "block"
    assert {"rule": "secret", "severity": "block", "kind": "aws_access_key"} in judgement.findings
    assert not PullRequest.objects.filter(task=submission.task).exists()
    assert not Artifact.objects.filter(run=run, content__contains=AWS_KEY).exists()
    assert not run.events.filter(data__icontains=AWS_KEY).exists()


def test_model_judge_scores_and_can_ask_for_a_revision(workspace, repository):
    script = demo.fix_script()
    script["judge"] = {"verdict": "accept", "score": 0.8, "reasons": "fixes add"}
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": script, "model_judge": True},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    model = run.judgements.get(judge="model")
    assert (model.verdict, model.score) == ("accept", 0.8)
    assert run.model_turns.filter(purpose="judge").count() == 1
